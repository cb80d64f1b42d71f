"""Launcher overhead on the SSH test bed, ddpctl side by side with bare `ssh ... torchrun` (the floor).

For 1 and 4 hosts (1 process each, a tiny training), cold (first run: code shipped) and warm (relaunch):
seconds from the command to torchrun running on every node (the launcher's own part), to the first training
step, and from the last epoch's end to everything pulled; then bytes shipped on a relaunch after a one-line
change. With --rounds N, bare and warm runs alternate N times (cold once) and the medians are shown, with each
round's warm/bare ratio and the load average: on a shared machine one round says little.
Needs root (network namespaces). Usage: python bench/bench_launcher.py [--hosts 1,4] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # infra/ is test support, not installed
from infra.testbed import Testbed, TestHost, cleanup_stale  # noqa: E402
from launcher.planning.plan import NodeHost, plan_remote  # noqa: E402
from launcher.spec.run_spec import RunSpec  # noqa: E402

TRAIN = ["--epochs", "1", "--synthetic-train-size", "512", "--synthetic-test-size", "128"]
CHECKOUT = Path(__file__).resolve().parent.parent  # the launcher and trainer measured are this checkout's


def events(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


def ddpctl_run(bed: Testbed, hosts: list[TestHost], runs: Path, *extra: str, cwd: Path | None = None,
               checkout: Path = CHECKOUT) -> dict:
    """One `ddpctl up` of `checkout` (its launcher and trainer); `extra` with `-- CMD` runs a user command."""
    env = {**os.environ, "DDPCTL_KNOWN_HOSTS": str(bed.known_hosts_path),
           "PYTHONPATH": os.pathsep.join(p for p in (str(checkout), os.environ.get("PYTHONPATH")) if p)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as a user's ddpctl runs: compiled once (the cold run), then cached
    host_args = [a for h in hosts for a in ("--host", h.spec)]
    train = [] if "--" in extra else TRAIN  # a user command takes its own options
    t0 = time.time()
    done = subprocess.run([sys.executable, "-m", "launcher", "up", "-i", bed.client_key_path, *host_args,
                           "--gpus", "1", "--runs-dir", str(runs), "--json", *train, *extra],
                          capture_output=True, text=True, env=env, cwd=cwd or checkout)
    t_end = time.time()
    if done.returncode != 0:
        raise SystemExit(f"ddpctl up failed: {done.stderr}")
    run = Path(json.loads(done.stdout)["run_dir"])
    ev = events(run)
    started = max(e["time"] for e in ev if e["event"] == "started")
    pulled = max(e["time"] for e in ev if e["event"] == "pulled")
    timing = [json.loads(x) for x in (run / "timing.jsonl").read_text().splitlines()]
    summary = json.loads((run / "summary.json").read_text())
    shipped = sum(e.get("bytes_sent", 0) for e in ev if e["event"] == "shipped")
    return {"launch": started - t0, "first_step": (summary.get("first_step_time") or t_end) - t0,
            "pull": pulled - timing[-1]["time"], "total": t_end - t0, "shipped": shipped}


def bare_run(bed: Testbed, hosts: list[TestHost]) -> dict:
    """The floor: torchrun started on every host by plain OpenSSH, trainer code already in place."""
    spec = RunSpec(run_id=f"bare{len(hosts)}", nnodes=len(hosts), nproc_per_node=1,
                   trainer_args=tuple(TRAIN[2:]), epochs=1, rdzv_port=29500)
    plan = plan_remote(spec, [NodeHost(h.spec, h.address, h.iface) for h in hosts])
    trainer = CHECKOUT / "trainer"
    for host in hosts:
        ws = Path(host.home) / plan.nodes[0].workspace
        shutil.rmtree(ws, ignore_errors=True)
        shutil.copytree(trainer, ws / "code" / "trainer")
        (ws / "out").mkdir()
        subprocess.run(["chown", "-R", f"{host.user}:", str(Path(host.home) / ".ddpctl")], check=True)
    t0 = time.time()
    procs = []
    for host, node in zip(hosts, plan.nodes, strict=True):
        line = f"cd {shlex.quote(node.workspace)} && env PYTHONPATH=code " + " ".join(
            f"{k}={shlex.quote(v)}" for k, v in node.env) + " " + shlex.join(node.command)
        procs.append(subprocess.Popen(
            ["ssh", "-q", "-i", bed.client_key_path, "-o", f"UserKnownHostsFile={bed.known_hosts_path}",
             "-o", "BatchMode=yes", "-p", str(host.port), f"{host.user}@{host.address}", line],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    for proc in procs:
        proc.wait()
    t_end = time.time()
    out = Path(hosts[0].home) / plan.nodes[0].workspace / "out"
    summary = json.loads(next(p for p in (Path(h.home) / plan.nodes[0].workspace / "out" / "summary.json"
                                          for h in hosts) if p.exists()).read_text())
    del out
    return {"launch": float("nan"), "first_step": summary["first_step_time"] - t0, "pull": float("nan"),
            "total": t_end - t0, "shipped": 0}


def one_line_change(bed: Testbed, hosts: list[TestHost], runs: Path) -> tuple[int, int]:
    """Bytes shipped for a user project (a copy of the trainer) on first launch and after a one-line edit."""
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        shutil.copytree(CHECKOUT / "trainer", project / "trainer")
        cmd = ["--", "python3", "-m", "trainer", "--out-dir", "../out", *TRAIN]
        first = ddpctl_run(bed, hosts, runs, *cmd, cwd=project)["shipped"]
        with open(project / "trainer" / "models.py", "a") as f:
            f.write("# a one-line change\n")
        second = ddpctl_run(bed, hosts, runs, *cmd, cwd=project)["shipped"]
    return first, second


def median_row(runs: list[dict]) -> dict:
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def show(name: str, measured: list[dict]) -> None:
    r = median_row(measured)
    print(f"{name:40} {r['launch']:11.2f} {r['first_step']:13.2f} {r['pull']:9.2f} {r['total']:10.2f} "
          f"{int(r['shipped']):12,d}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="1,4")
    parser.add_argument("--rounds", type=int, default=1, help="bare and warm runs per host count (medians shown)")
    parser.add_argument("--baseline", type=Path, help="another checkout's ddpctl, measured in the same rounds")
    args = parser.parse_args()
    counts = [int(x) for x in args.hosts.split(",")]
    checkouts = {"ddpctl": CHECKOUT, **({f"baseline {args.baseline.name}": args.baseline.resolve()}
                                         if args.baseline else {})}
    cleanup_stale("ddpbn")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"python {platform.python_version()}; test-bed hosts are network namespaces on this machine; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {args.rounds} round(s), medians shown")
    for name, path in checkouts.items():
        commit = subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        print(f"{name}: commit {commit or 'unknown'}")
    print(f"{'':40} {'launch (s)':>11} {'1st step (s)':>13} {'pull (s)':>9} {'total (s)':>10} {'shipped (B)':>12}")
    loads = [os.getloadavg()]
    bed = Testbed("ddpbn", n_hosts=max(counts), host_python=True)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            runs = Path(tmp)
            for n in counts:
                hosts = bed.hosts[:n]
                cold = {name: [ddpctl_run(bed, hosts, runs, checkout=path)] for name, path in checkouts.items()}
                bare: list[dict] = []
                warm: dict[str, list[dict]] = {name: [] for name in checkouts}
                for _ in range(args.rounds):  # alternating, so each sees the same load
                    bare.append(bare_run(bed, hosts))
                    for name, path in checkouts.items():
                        warm[name].append(ddpctl_run(bed, hosts, runs, checkout=path))
                    loads.append(os.getloadavg())
                show(f"bare ssh+torchrun, {n} host(s)", bare)
                for name in checkouts:
                    show(f"{name} cold, {n} host(s)", cold[name])
                    show(f"{name} warm, {n} host(s)", warm[name])
                for name in checkouts:
                    each = [w["first_step"] / b["first_step"] for w, b in zip(warm[name], bare, strict=True)]
                    print(f"  {name} warm first step / bare, {n} host(s): median {statistics.median(each):.2f}x "
                          f"(rounds: {' '.join(f'{x:.2f}' for x in each)})", flush=True)
            first, second = one_line_change(bed, bed.hosts[:1], runs)
    finally:
        bed.stop()
    one_minute = [load[0] for load in loads]
    print(f"load average (1 min) during the runs: {min(one_minute):.2f} to {max(one_minute):.2f}, "
          f"median {statistics.median(one_minute):.2f}")
    print(f"user project shipped: {first:,d} B on first launch, {second:,d} B after a one-line change")


if __name__ == "__main__":
    main()
