"""Slurm: seconds from `ddpctl up --provider slurm` to the first training step, beside a bare `sbatch` of the same
batch script (its code already on the shared file system), on the real test cluster (infra/slurm_cluster.py) with
an empty queue. Runs alternate (ddpctl, bare, ddpctl, ...) so both see the same machine load, each started once the
queue is empty and the nodes idle (the previous round's job ended). Needs root.

Usage: python bench/bench_slurm.py [--rounds 2] [--out FILE]
Prints a table and writes bench/results/slurm.json (or --out), with the load average before and after the rounds
(the machine is shared) and the commit measured. The overhead is ddpctl's: Python's start and the launcher's
imports, SSH to the login node, the probe and preflight (scontrol, sinfo, the login Python, which lists the code
cache too, sbatch --test-only), shipping what changed, writing the job's files and submitting it (one command); the
rest (queue, srun, torch import, rendezvous) is the same job. The launcher is byte-compiled first, as an installed
ddpctl is (pip compiles what it installs): where PYTHONDONTWRITEBYTECODE is set, as on the project's machines, every
round would otherwise compile the launcher's modules it imports from source, which no installed ddpctl does."""

from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # infra/ is test support, not installed
from infra.slurm_cluster import SlurmCluster  # noqa: E402
from infra.testbed import Testbed, cleanup_stale  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TRAIN = ["--nodes", "2", "--gpus", "1", "--epochs", "1", "--synthetic-train-size", "512",
         "--synthetic-test-size", "128"]
PREFIX = "ddpslb"
SUBMIT_SECONDS: list[float] = []  # per ddpctl round: from the command to its sbatch (connect, probe, ship, write)


def first_step(folder: Path, timeout: float = 300) -> float:
    """The trainer's first_step_time (unix) from the summary rank 0's node wrote in `folder`/nodes/*/out."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for summary in folder.glob("nodes/*/out/summary.json"):
            return float(json.loads(summary.read_text())["first_step_time"])
        time.sleep(0.5)
    raise RuntimeError(f"no summary.json under {folder} within {timeout:.0f} s")


def settle(cluster: SlurmCluster, timeout: float = 120) -> None:
    """Wait until the queue is empty and every node is idle, then a second more, so that each round starts from
    the same cluster: a bare round ends at its first step's record, which the trainer writes at the end of training,
    while its job is still ending (torchrun, the step, the epilog), and a job submitted then waits for its nodes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        queued = cluster.slurm("squeue", "-h", check=False).stdout.strip()
        states = cluster.slurm("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.split()
        if not queued and states and all(state.rstrip("*") == "idle" for state in states):
            time.sleep(1)
            return
        time.sleep(0.2)
    raise RuntimeError(f"the cluster did not settle (empty queue, idle nodes) within {timeout:.0f} s")


def ddpctl_round(cluster: SlurmCluster, runs: Path) -> tuple[float, Path]:
    env = {**os.environ, "DDPCTL_KNOWN_HOSTS": str(cluster.bed.known_hosts_path), "PYTHONPATH": str(REPO)}
    t0 = time.time()
    done = subprocess.run([sys.executable, "-m", "launcher", "up", "-i", cluster.bed.client_key_path, "--provider",
                           "slurm", "--host", cluster.login.spec, "--runs-dir", str(runs), *TRAIN],
                          capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"ddpctl up failed: {done.stderr[-2000:]}")
    run = max(runs.iterdir(), key=lambda p: p.stat().st_mtime)
    submitted = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()
                 if '"submitted"' in line]
    SUBMIT_SECONDS.append(float(submitted[0]["time"]) - t0)  # ddpctl's own part: all it does before sbatch
    return first_step(run) - t0, run


def bare_round(cluster: SlurmCluster, template: Path, n: int) -> float:
    """The script ddpctl submitted, pointed at a copy of its run folder (code included), submitted with ssh +
    sbatch as a user would."""
    record = json.loads((template / "run.json").read_text())
    source = record["slurm"]["remote_dir"]
    folder = f"{source}-bare{n}"
    script = (template / "job.sbatch").read_text().replace(source, folder)
    login = cluster.login
    login.run_as_user(["sh", "-c", 'rm -rf "$2" && mkdir -p "$2" && cp -R "$1/code" "$2/code" && '
                       'cp "$1/torchrun_attempts.py" "$2/"', "copy", source, folder])
    ssh = ["ssh", "-i", cluster.bed.client_key_path, "-o", f"UserKnownHostsFile={cluster.bed.known_hosts_path}",
           "-o", "BatchMode=yes", f"{login.user}@{login.address}"]
    Path(login.home, "bare.sbatch").write_text(script)
    os.chown(Path(login.home, "bare.sbatch"), *_owner(login.home))
    t0 = time.time()
    subprocess.run([*ssh, "sbatch", "--parsable", "bare.sbatch"], check=True, capture_output=True, timeout=60)
    return first_step(Path(folder)) - t0


def _commit() -> str:
    """The checkout's commit (with `+changes` where its tracked files differ from it): what was measured."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=REPO, capture_output=True)
    return (head.stdout.strip() or "unknown") + ("+changes" if dirty.returncode else "")


def _owner(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_uid, st.st_gid


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "slurm.json",
                        help="where the figures go (default bench/results/slurm.json)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds: give 1 or more")
    if not compileall.compile_dir(REPO / "launcher", quiet=1):  # as pip leaves an installed ddpctl
        print("could not byte-compile launcher/: the rounds would compile it each time", file=sys.stderr)
        return 1
    cleanup_stale(PREFIX)
    load_before = list(os.getloadavg())
    ddpctl_times: list[float] = []
    bare_times: list[float] = []
    with Testbed(PREFIX, n_hosts=3, host_python=True) as bed, SlurmCluster(bed) as cluster, \
            tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / "runs"
        for n in range(args.rounds):
            settle(cluster)
            seconds, run = ddpctl_round(cluster, runs)
            ddpctl_times.append(seconds)
            settle(cluster)
            bare_times.append(bare_round(cluster, run, n))
            print(f"round {n + 1}: ddpctl up {ddpctl_times[-1]:.1f} s ({SUBMIT_SECONDS[-1]:.1f} s of it before its "
                  f"sbatch), bare sbatch {bare_times[-1]:.1f} s to the first training step", flush=True)
    result = {"machine": f"{platform.node()} ({os.cpu_count()} cores)", "rounds": args.rounds,
              "ddpctl_seconds": ddpctl_times, "bare_sbatch_seconds": bare_times,
              "ddpctl_before_sbatch_seconds": SUBMIT_SECONDS,
              "ddpctl_before_sbatch_median": statistics.median(SUBMIT_SECONDS),
              "bytecode": "launcher/ compiled before the rounds, as an installed ddpctl is",
              "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE"),
              "load_average_before": load_before, "load_average": list(os.getloadavg()),
              "commit": _commit(),
              "ddpctl_median": statistics.median(ddpctl_times), "bare_median": statistics.median(bare_times),
              "ratio": statistics.median(ddpctl_times) / statistics.median(bare_times),
              "round_ratios": [d / b for d, b in zip(ddpctl_times, bare_times, strict=True)],
              "round_ratio_median": statistics.median(d / b for d, b in zip(ddpctl_times, bare_times, strict=True)),
              # ddpctl's job from its sbatch to the first step, less the bare round's (paired): what ddpctl adds after
              # submitting (its follow's polls), apart from its part before sbatch
              "after_sbatch_minus_bare_median": statistics.median(
                  d - before - b for d, before, b in zip(ddpctl_times, SUBMIT_SECONDS, bare_times, strict=True)),
              "what": "seconds from the command to the trainer's first step, 2 nodes x 1 process, empty queue"}
    print(f"median: ddpctl up {result['ddpctl_median']:.1f} s, bare sbatch {result['bare_median']:.1f} s, "
          f"ratio {result['ratio']:.2f} (round by round: median {result['round_ratio_median']:.2f}); before its "
          f"sbatch {result['ddpctl_before_sbatch_median']:.2f} s, after it "
          f"{result['after_sbatch_minus_bare_median']:+.2f} s against bare (paired median); "
          f"load average {load_before[0]:.1f} before, "
          f"{result['load_average'][0]:.1f} after")
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
