"""`ddpctl doctor --bandwidth` against a known link: the bus bandwidth and latency it measures between two test-bed
hosts (varied: eth0 and ens5) with no limit and with host 1's egress held by `tc tbf` to 50 and 200 Mbit/s, and
per limit a short 2-node training run started with `--check-bandwidth`: its exposed communication share
(summary.json's exposed_comm_fraction), and the 2-node efficiency the report predicts from the bandwidth measured
before it, against the efficiency measured (against a 1-node run of the same round).

Each of --rounds rounds measures every limit in turn (so a busy spell of the shared machine spreads over all of
them); medians and the spread are printed as a Markdown table, with the machine named.
Needs root (network namespaces). Usage: python bench/bench_bandwidth.py [--rounds 3] [--model mnist-cnn]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # infra/ is test support, not installed
from infra.testbed import Testbed, TestHost, cleanup_stale  # noqa: E402
from launcher.results.run_figures import load_run, scaling_table  # noqa: E402

CHECKOUT = Path(__file__).resolve().parent.parent
TC = "/usr/sbin/tc"
LIMITS = (None, 200, 50)  # Mbit/s on host 1's egress; None: the bare veth pair
PREFIX = "ddpbw"


@contextlib.contextmanager
def limited(host: TestHost, mbit: int | None) -> Iterator[None]:
    if mbit is None:
        yield
        return
    subprocess.run([*host.nsenter(), TC, "qdisc", "add", "dev", host.iface, "root", "tbf", "rate", f"{mbit}mbit",
                    "burst", "64kbit", "latency", "400ms"], check=True)
    try:
        yield
    finally:
        subprocess.run([*host.nsenter(), TC, "qdisc", "del", "dev", host.iface, "root"], check=True)


def ddpctl(bed: Testbed, *args: str, hosts: list[TestHost] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DDPCTL_KNOWN_HOSTS": str(bed.known_hosts_path), "PYTHONPATH": str(CHECKOUT)}
    command, *rest = args
    hosts_args = [a for h in (hosts or bed.hosts) for a in ("--host", h.spec)]
    return subprocess.run([sys.executable, "-m", "launcher", command, "-i", bed.client_key_path, *hosts_args, *rest],
                          capture_output=True, text=True, env=env, cwd=CHECKOUT, timeout=600)


def doctor(bed: Testbed, model: str) -> dict:
    done = ddpctl(bed, "doctor", "--bandwidth", "--json", "--model", model)
    if done.returncode:
        raise SystemExit(f"doctor failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout)


def train(bed: Testbed, runs: Path, *extra: str, hosts: list[TestHost] | None = None) -> Path:
    """One short run (1 process per host); its run directory."""
    done = ddpctl(bed, "up", "--gpus", "1", "--dataset", "synthetic", "--epochs", "2", "--runs-dir", str(runs),
                  *extra, hosts=hosts)
    if done.returncode:
        raise SystemExit(f"up failed: {done.stderr.strip()[-500:]}")
    (run,) = [p for p in runs.iterdir() if p.is_dir()]
    return run


def two_node_figures(one: Path, two: Path) -> tuple[float, float, float]:
    """The 2-node run's exposed share, predicted and measured efficiency, as `ddpctl report` computes them."""
    rows = scaling_table([load_run(one), load_run(two)])
    row = rows[1]
    if row.exposed_comm_fraction is None or row.predicted_efficiency is None:
        raise SystemExit(f"{two}: no exposed share or no bandwidth measured")
    return row.exposed_comm_fraction, row.predicted_efficiency, row.efficiency


def spread(values: list[float], fmt: str) -> str:
    return f"{format(statistics.median(values), fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="mnist-cnn", help="whose gradient is the largest message")
    args = parser.parse_args()
    cleanup_stale(PREFIX)
    found: dict[int | None, dict[str, list[float]]] = {
        m: {"busbw": [], "latency": [], "exposed": [], "predicted": [], "measured": []} for m in LIMITS}
    with Testbed(PREFIX, n_hosts=2, ports=[22, 2222], host_python=True, varied=True) as bed, \
            tempfile.TemporaryDirectory() as tmp:
        for round_index in range(args.rounds):
            one = train(bed, Path(tmp) / f"{round_index}-one", hosts=bed.hosts[:1])
            for mbit in LIMITS:
                with limited(bed.hosts[1], mbit):
                    figures = doctor(bed, args.model)
                    two = train(bed, Path(tmp) / f"{round_index}-{mbit}", "--check-bandwidth")
                share, predicted, measured = two_node_figures(one, two)
                for name, value in (("busbw", figures["busbw_gbit_s"] * 1000), ("latency", figures["latency_ms"]),
                                    ("exposed", share), ("predicted", predicted), ("measured", measured)):
                    found[mbit][name].append(value)
                print(f"round {round_index + 1} limit {mbit or 'none'}: busbw {figures['busbw_gbit_s'] * 1000:.1f} "
                      f"Mbit/s, latency {figures['latency_ms']:.3f} ms, exposed {share:.2f}, efficiency predicted "
                      f"{predicted:.2f} measured {measured:.2f}", file=sys.stderr)
        max_bytes = figures["bandwidth"]["max_bytes"]
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    print(f"Machine: {cpu}, {os.cpu_count()} cores; load average at the end {os.getloadavg()[0]:.1f}. "
          f"{args.rounds} rounds, median (min-max); largest message {max_bytes:,} B ({args.model}'s gradient).\n")
    print("| link limit | doctor's bus bandwidth (Mbit/s) | against the limit | latency (ms) | exposed comm share "
          "| 2-node efficiency predicted | measured |")
    print("|---|---|---|---|---|---|---|")
    for mbit in LIMITS:
        row = found[mbit]
        ratio = f"{statistics.median(row['busbw']) / mbit:.2f}x" if mbit else "-"
        print(f"| {f'{mbit} Mbit/s' if mbit else 'none'} | {spread(row['busbw'], '.1f')} | {ratio} | "
              f"{spread(row['latency'], '.3f')} | {spread(row['exposed'], '.2f')} | "
              f"{spread(row['predicted'], '.2f')} | {spread(row['measured'], '.2f')} |")


if __name__ == "__main__":
    main()
