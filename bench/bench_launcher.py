"""Launcher overhead on the SSH test bed, ddpctl side by side with bare `ssh ... torchrun` (the floor).

For 1 and 4 hosts (1 process each, a tiny training), cold (first run: code shipped) and warm (relaunch):
seconds from the command to torchrun running on every node (the launcher's own part), to the first training
step, and from the last epoch's end to everything pulled; then bytes shipped on a relaunch after a one-line
change. Needs root (network namespaces). Usage: python bench/bench_launcher.py [--hosts 1,4]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
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


def events(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


def ddpctl_run(bed: Testbed, hosts: list[TestHost], runs: Path, *extra: str, cwd: Path | None = None) -> dict:
    env = {**os.environ, "DDPCTL_KNOWN_HOSTS": str(bed.known_hosts_path)}
    host_args = [a for h in hosts for a in ("--host", h.spec)]
    t0 = time.time()
    done = subprocess.run([sys.executable, "-m", "launcher", "up", "-i", bed.client_key_path, *host_args,
                           "--gpus", "1", "--runs-dir", str(runs), "--json", *TRAIN, *extra],
                          capture_output=True, text=True, env=env, cwd=cwd)
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
    trainer = Path(__file__).resolve().parent.parent / "trainer"
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
        shutil.copytree(Path(__file__).resolve().parent.parent / "trainer", project / "trainer")
        cmd = ["--", "python3", "-m", "trainer", "--out-dir", "../out", *TRAIN]
        first = ddpctl_run(bed, hosts, runs, *cmd, cwd=project)["shipped"]
        with open(project / "trainer" / "models.py", "a") as f:
            f.write("# a one-line change\n")
        second = ddpctl_run(bed, hosts, runs, *cmd, cwd=project)["shipped"]
    return first, second


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="1,4")
    counts = [int(x) for x in parser.parse_args().hosts.split(",")]
    cleanup_stale("ddpbn")
    bed = Testbed("ddpbn", n_hosts=max(counts), host_python=True)
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            runs = Path(tmp)
            for n in counts:
                hosts = bed.hosts[:n]
                rows.append((f"bare ssh+torchrun, {n} host(s)", bare_run(bed, hosts)))
                rows.append((f"ddpctl cold, {n} host(s)", ddpctl_run(bed, hosts, runs)))
                rows.append((f"ddpctl warm, {n} host(s)", ddpctl_run(bed, hosts, runs)))
            first, second = one_line_change(bed, bed.hosts[:1], runs)
    finally:
        bed.stop()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"python {platform.python_version()}; test-bed hosts are network namespaces on this machine")
    print(f"{'':34} {'launch (s)':>11} {'1st step (s)':>13} {'pull (s)':>9} {'total (s)':>10} {'shipped (B)':>12}")
    for name, r in rows:
        print(f"{name:34} {r['launch']:11.2f} {r['first_step']:13.2f} {r['pull']:9.2f} {r['total']:10.2f} "
              f"{r['shipped']:12,d}")
    warm = {n: r for name, r in rows for n in counts if name == f"ddpctl warm, {n} host(s)"}
    if len(counts) > 1:
        a, b = counts[0], counts[-1]
        print(f"warm first step, {b} hosts / {a}: {warm[b]['first_step'] / warm[a]['first_step']:.2f}x")
    print(f"user project shipped: {first:,d} B on first launch, {second:,d} B after a one-line change")


if __name__ == "__main__":
    main()
