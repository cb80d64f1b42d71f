"""`ddpctl doctor --bandwidth` against a known link: the bus bandwidth and latency it measures between two test-bed
hosts (varied: eth0 and ens5) with no limit and with host 1's egress held by `tc tbf` to 50 and 200 Mbit/s, and
per limit the exposed communication share of a short 2-node training run (summary.json's exposed_comm_fraction).

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


def ddpctl(bed: Testbed, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DDPCTL_KNOWN_HOSTS": str(bed.known_hosts_path), "PYTHONPATH": str(CHECKOUT)}
    command, *rest = args
    hosts = [a for h in bed.hosts for a in ("--host", h.spec)]
    return subprocess.run([sys.executable, "-m", "launcher", command, "-i", bed.client_key_path, *hosts, *rest],
                          capture_output=True, text=True, env=env, cwd=CHECKOUT, timeout=600)


def doctor(bed: Testbed, model: str) -> dict:
    done = ddpctl(bed, "doctor", "--bandwidth", "--json", "--model", model)
    if done.returncode:
        raise SystemExit(f"doctor failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout)


def exposed_share(bed: Testbed, runs: Path) -> float:
    done = ddpctl(bed, "up", "--gpus", "1", "--dataset", "synthetic", "--epochs", "1", "--runs-dir", str(runs),
                  "--json")
    if done.returncode:
        raise SystemExit(f"up failed: {done.stderr.strip()[-500:]}")
    return float(json.loads(done.stdout)["summary"]["exposed_comm_fraction"])


def spread(values: list[float], fmt: str) -> str:
    return f"{format(statistics.median(values), fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="mnist-cnn", help="whose gradient is the largest message")
    args = parser.parse_args()
    cleanup_stale(PREFIX)
    found: dict[int | None, dict[str, list[float]]] = {m: {"busbw": [], "latency": [], "exposed": []} for m in LIMITS}
    with Testbed(PREFIX, n_hosts=2, ports=[22, 2222], host_python=True, varied=True) as bed, \
            tempfile.TemporaryDirectory() as tmp:
        for round_index in range(args.rounds):
            for mbit in LIMITS:
                with limited(bed.hosts[1], mbit):
                    figures = doctor(bed, args.model)
                    share = exposed_share(bed, Path(tmp) / f"{round_index}-{mbit}")
                found[mbit]["busbw"].append(figures["busbw_gbit_s"] * 1000)
                found[mbit]["latency"].append(figures["latency_ms"])
                found[mbit]["exposed"].append(share)
                print(f"round {round_index + 1} limit {mbit or 'none'}: busbw {figures['busbw_gbit_s'] * 1000:.1f} "
                      f"Mbit/s, latency {figures['latency_ms']:.3f} ms, exposed {share:.2f}", file=sys.stderr)
        max_bytes = figures["bandwidth"]["max_bytes"]
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    print(f"Machine: {cpu}, {os.cpu_count()} cores; load average at the end {os.getloadavg()[0]:.1f}. "
          f"{args.rounds} rounds, median (min-max); largest message {max_bytes:,} B ({args.model}'s gradient).\n")
    print("| link limit | doctor's bus bandwidth (Mbit/s) | against the limit | latency (ms) | exposed comm share |")
    print("|---|---|---|---|---|")
    for mbit in LIMITS:
        row = found[mbit]
        ratio = f"{statistics.median(row['busbw']) / mbit:.2f}x" if mbit else "-"
        print(f"| {f'{mbit} Mbit/s' if mbit else 'none'} | {spread(row['busbw'], '.1f')} | {ratio} | "
              f"{spread(row['latency'], '.3f')} | {spread(row['exposed'], '.2f')} |")


if __name__ == "__main__":
    main()
