"""The contract every place keeps, asked of its Place as the commands ask it (launcher/cli/run_commands.py): `up
--detach` of a `-- python script.py` run, `status` shows every node running, `logs --rank 0` shows rank 0's lines,
`down` stops it, and nothing of it is left. tests/test_place_registry.py runs it on a toy place, this machine, two
SSH hosts and the test Slurm cluster; tests/test_remote_docker.py on two SSH hosts with the Docker runtime;
tests/test_vast_up.py on a machine rented from the Vast.ai stand-in. Where a
place says a thing its own way, `Said` holds that one line and the contract asserts it."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from infra.testbed import Testbed
from launcher.places.registry import place_named, place_of_record, run_up
from launcher.planning.request import UpOptions
from launcher.results.rundir import RunDir
from launcher.spec.hosts import HostSpec, parse_host
from launcher.spec.run_spec import RunSpec, new_run_id
from tests.faults.fault_support import wait_for
from tests.test_local_place import processes_of

SCRIPT = """import os, sys, time
for step in range(3000):  # 10 minutes at most: `down` ends it long before
    print(f"toy step {step} of rank {os.environ['RANK']}", flush=True)
    time.sleep(0.2)
"""


@dataclass(frozen=True)
class Said:
    """What a place says where the contract lets it say it its own way (in one line each)."""

    running: str = "running"  # the state column of a node that runs
    stopped: str = "stopped run {run_id}"  # how `down`'s answer starts


# A Slurm job's state is Slurm's word; `down` cancels the job.
SLURM_SAYS = Said(running="RUNNING", stopped="cancelled job ")
# Vast.ai's `down` gives the machines back once the results are verified.
VAST_SAYS = Said(stopped="run {run_id}: machines destroyed (verified)")


def keeps_the_contract(name: str, folder: Path, capsys: pytest.CaptureFixture[str], bed: Testbed | None = None,
                       hosts: tuple[HostSpec, ...] | None = None, extra: dict[str, Any] | None = None,
                       said: Said = Said(), left_in: Callable[[RunDir], list[Path]] | None = None) -> RunDir:
    """up --detach of `-- python script.py` through place `name` (on the bed's hosts, one node each, when given;
    `hosts`: the --host options instead; `extra`: its own options, e.g. what it rents or allocates); status: every node
    running; logs --rank 0: rank 0's lines; down stops it, and nothing of it is left (here, or in the hosts' run
    folders)."""
    (folder / "script.py").write_text(SCRIPT)
    if hosts is None:
        hosts = tuple(parse_host(h.spec) for h in bed.hosts) if bed else ()
    # One node per --host where the user names the nodes; else one node.
    nnodes = len(hosts) if place_named(name).hosts_per_node else 1
    spec = RunSpec(run_id=new_run_id(None, "script", "none", ("python", "script.py")), nproc_per_node=1,
                   nnodes=nnodes, user_command=("python", "script.py"),
                   python=sys.executable if place_named(name).runs_here else "python3")
    key = Path(bed.client_key_path) if bed else None
    options = UpOptions(runs_dir=folder / "runs", provider=name, detach=True, show_progress=False,
                        show_output=False, hosts=hosts, identity_file=key, auto_rdzv_port=True,
                        **(extra or {}))
    started = run_up(spec, options)
    assert started.exit_code == 0 and started.run_dir is not None
    run_dir = RunDir.open(started.run_dir)
    places = [run_dir.path] + ([Path(h.home, ".ddpctl", "runs", spec.run_id) for h in bed.hosts] if bed else [])
    places += left_in(run_dir) if left_in else []  # where else the run's processes would name (a job's folder)
    place = place_of_record(run_dir.typed_record())
    assert place is place_named(name)
    asked = UpOptions(runs_dir=folder / "runs", show_progress=False, identity_file=key)
    try:
        rows = wait_for("every node to be running", lambda: (rows := place.status_rows(run_dir, asked)) and all(
            row["state"] == said.running for row in rows) and rows, timeout=120)
        assert [row["node"] for row in rows] == list(range(spec.nnodes))
        capsys.readouterr()

        def logged() -> str | None:
            place.print_rank_log(run_dir, 0, 5, False, asked, None)  # `logs --rank 0`, the same on every place
            out, err = capsys.readouterr()
            assert "showing the copy pulled" not in err, err  # read where the run is, not a copy
            steps = [int(n) for n in re.findall(r"^toy step (\d+) of rank 0$", out, flags=re.MULTILINE)]
            return out if steps and max(steps) >= 3 else None  # its lines, however far it got (the last 5 shown)

        assert "toy step" in wait_for("rank 0's lines in logs", logged, timeout=120)
        answer = place.down(run_dir, asked, False)
        assert answer.startswith(said.stopped.format(run_id=run_dir.run_id)), answer
        assert all(row["state"] != said.running for row in place.status_rows(run_dir, asked))
        wait_for("nothing of the run left", lambda: not any(processes_of(p) for p in places), timeout=10)
    finally:
        for pid in [pid for p in places for pid in processes_of(p)]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    return run_dir
