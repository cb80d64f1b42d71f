"""The suite's CPU, per test: a pytest plugin that puts each pytest process (each xdist worker) in a cpuacct cgroup
of its own and charges each test the cgroup's CPU over its set-up, call and tear-down: everything the test started
is counted (ddpctl, torchrun, ranks, the test bed's sshd sessions and what they run), but not Docker's containers
(dockerd starts them). A worker runs one test at a time, so the figures add up per test and per module.

Needs root and cgroup v1's cpuacct (/sys/fs/cgroup/cpuacct). Usage, then the table by module:
    PYTHONPATH=bench bash infra/test.sh -p suite_cpu            # SUITE_CPU_OUT=FILE (default suite-cpu.jsonl)
    python bench/suite_cpu.py suite-cpu.jsonl
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
_group: Path | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _group
    if not (CPUACCT / "cgroup.procs").exists() or os.geteuid() != 0:
        raise pytest.UsageError("suite_cpu: needs root and cgroup v1's cpuacct at /sys/fs/cgroup/cpuacct")
    _group = CPUACCT / f"suite-cpu-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{os.getpid()}"
    _group.mkdir(exist_ok=True)
    (_group / "cgroup.procs").write_text(str(os.getpid()))


def pytest_unconfigure(config: pytest.Config) -> None:
    """Leave the cgroup (to the root group) and remove it; processes left in it keep it, and are named."""
    if _group is None:
        return
    (CPUACCT / "cgroup.procs").write_text(str(os.getpid()))
    left = (_group / "cgroup.procs").read_text().split()
    if left:
        print(f"suite_cpu: processes left in {_group}: {' '.join(left)}", file=sys.stderr)
    else:
        _group.rmdir()


def _used() -> float:
    assert _group is not None
    return int((_group / "cpuacct.usage").read_text()) / 1e9


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, None]:
    cpu, start = _used(), time.time()
    yield
    record = {"test": item.nodeid, "cpu_s": round(_used() - cpu, 2), "wall_s": round(time.time() - start, 2),
              "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "start": start}
    with open(os.environ.get("SUITE_CPU_OUT", "suite-cpu.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")


def by_module(path: Path) -> list[tuple[str, float, float, int]]:
    """(module, CPU s, wall s, tests), costliest first."""
    modules: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for line in path.read_text().splitlines():
        record = json.loads(line)
        entry = modules[record["test"].split("::")[0]]
        entry[0] += record["cpu_s"]
        entry[1] += record["wall_s"]
        entry[2] += 1
    return sorted(((m, cpu, wall, int(n)) for m, (cpu, wall, n) in modules.items()), key=lambda row: -row[1])


def main() -> None:
    rows = by_module(Path(sys.argv[1] if len(sys.argv) > 1 else "suite-cpu.jsonl"))
    print(f"{'CPU (s)':>8} {'wall (s)':>9} {'tests':>6}  module   (total CPU {sum(r[1] for r in rows):.0f} s)")
    for module, cpu, wall, tests in rows:
        print(f"{cpu:8.1f} {wall:9.1f} {tests:6d}  {module}")


if __name__ == "__main__":
    main()
