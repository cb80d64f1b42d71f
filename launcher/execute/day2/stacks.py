"""`ddpctl stacks RUN`: the stacks of a live run's ranks on demand, from its run directory alone — over SSH for a
run on hosts (Vast.ai machines too, while they are rented), here for a run on this machine."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.errors import DdpctlError
from launcher.execute.hosts.node_stops import node_workspaces
from launcher.execute.hosts.run import reattach
from launcher.execute.stacks import StacksTaken, take_stacks
from launcher.execute.this_machine.state import local_torchrun_running
from launcher.results.rundir import RunDir

if TYPE_CHECKING:
    from launcher.planning.request import UpOptions


def take_recorded_stacks(run_dir: RunDir, options: UpOptions) -> StacksTaken:
    """Take every rank's stack of the recorded run; keep them in its run directory; return the verdict."""
    record = run_dir.record()  # a Slurm job's place refuses before this (launcher/places/slurm/__init__.py)
    if record.get("hosts"):
        with reattach(run_dir, options) as session:
            return take_stacks(run_dir, session, node_workspaces(run_dir))
    if not local_torchrun_running(record):
        raise DdpctlError(f"run {run_dir.run_id} is not running (no stacks to take): `ddpctl status "
                          f"{run_dir.run_id}` says how it ended")
    return take_stacks(run_dir, None, [str(run_dir.path)])
