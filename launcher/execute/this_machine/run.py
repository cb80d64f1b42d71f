"""Run a planned single-node job on this machine: torchrun as a child process in its own session."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from launcher.errors import DdpctlError, RunStopRequested, SpecError
from launcher.execute.following import interruption
from launcher.execute.following.hang_watch import RunWatch
from launcher.execute.following.live_output import LiveOutput
from launcher.execute.following.outside_stops import DOWN_EVENT
from launcher.execute.following.plain_progress import run_progress
from launcher.execute.following.stall_watch import StallWatch
from launcher.execute.this_machine.checks import FirstStepWatch, check_cpu_processes, check_local_rendezvous
from launcher.execute.this_machine.state import run_mark
from launcher.planning.mpi_check import check_local_mpi
from launcher.planning.plan import RunPlan, plan_local
from launcher.planning.preflight import check_local_disk
from launcher.remote.node_stop import stop_processes, workspace_path
from launcher.remote.proctree import start_time
from launcher.results.progress import FreshestProgress, stall_note
from launcher.results.rundir import RunDir, read_json
from launcher.runtimes.join_files import write_local_hook
from launcher.spec.datasets import check_local_data
from launcher.spec.run_spec import RunSpec
from launcher.spec.strategies import check_gpus, processes_per_node
from launcher.spec.torchrun import TORCHRUN_SOURCE, WRAPPER_FILE, shown_argv
from launcher.spec.user_command import node_command

POLL_SECONDS = 0.5
STOP_GRACE_SECONDS = 30.0


def local_gpu_count() -> int:
    """GPUs this machine's processes can use: those nvidia-smi lists (0 when there is no driver), narrowed by
    CUDA_VISIBLE_DEVICES as CUDA reads it; no torch needed."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    present = sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return present if visible is None else min(present, visible_device_count(visible, present))


def visible_device_count(value: str, present: int) -> int:
    """How many devices CUDA_VISIBLE_DEVICES=value shows: its entries up to the first invalid one."""
    count = 0
    for entry in value.split(","):
        entry = entry.strip()
        if not ((entry.isdigit() and int(entry) < present) or entry.startswith(("GPU-", "MIG-"))):
            break
        count += 1
    return count


def default_local_procs() -> int:
    """One process per local GPU, or 2 on a CPU-only machine (enough to exercise DDP)."""
    return local_gpu_count() or 2


def check_local_gpus(nproc: int) -> None:
    gpus = local_gpu_count()
    if gpus and nproc > gpus:
        where = " (as CUDA_VISIBLE_DEVICES shows them)" if "CUDA_VISIBLE_DEVICES" in os.environ else ""
        raise SpecError(f"--gpus {nproc} asks for more GPUs than this machine has{where} ({gpus}); "
                        f"use --gpus {gpus} or less")


def check_local_programs(plan: RunPlan) -> None:
    """Refuse a --python, or the program of `-- CMD`, that this machine cannot start (before anything is written:
    torchrun would fail to start, or each worker would)."""
    node = plan.nodes[0]
    path = dict(node.env).get("PATH", os.environ.get("PATH"))
    python = plan.spec.python
    if shutil.which(python, path=path) is None:
        raise SpecError(f"--python {python!r}: {_not_runnable(python)}; give a Python that has torch installed, "
                        "e.g. --python python3 or --python /opt/venv/bin/python")
    if plan.spec.user_command:
        program = node_command(plan.spec.user_command, python)[0]
        if shutil.which(program, path=path) is None:
            raise SpecError(f"the command after `--`: {_not_runnable(program)}; give a program on PATH or the path "
                            "of an executable file, e.g. `-- python3 my_train.py`")


def _not_runnable(program: str) -> str:
    if os.sep not in program:
        return f"no program {program!r} on PATH"
    if not os.path.isfile(program):
        return f"there is no file {program}"
    return f"{program} is not executable"


def check_local_run(spec: RunSpec, run_path: Path | None = None) -> RunPlan:
    """What a run on this machine needs before anything is written: the data set, enough GPUs, a python (and
    the `-- CMD` program) that can start. Returns the run's plan (for a run directory at run_path)."""
    if not spec.user_command:
        check_local_data(spec.dataset, spec.data_dir)
    if spec.launcher == "mpirun":
        check_local_mpi(spec)
    check_local_gpus(spec.nproc_per_node)
    check_cpu_processes(processes_per_node(spec.strategy, spec.nproc_per_node), local_gpu_count())
    check_gpus(spec.strategy, spec.devices, spec.nproc_per_node, local_gpu_count(), "this machine")
    check_local_rendezvous()
    plan = plan_local(spec, str(run_path or Path(spec.run_id).resolve()), cwd=os.getcwd())
    check_local_programs(plan)
    check_local_disk(spec, run_path or Path(spec.run_id).resolve())
    return plan


def run_local(plan: RunPlan, run_dir: RunDir, show_progress: bool = True, show_output: bool = True,
              stall_timeout: float = 0.0) -> int:
    """Start torchrun, follow its progress until it ends, and return its exit code (130 after Ctrl-C). A run
    stopped by `ddpctl down`, or past `stall_timeout` seconds without a training step, raises RunStopRequested
    with the line that says so (launcher/execute/following/stall_watch.py, as on hosts)."""
    node = plan.nodes[0]
    env = {**os.environ, **dict(node.env), **run_mark(run_dir)}  # the mark: how `down` finds every process of it
    if plan.spec.user_command:  # the join hook first on the script's path: the world it forms is measured
        hook = str(write_local_hook(run_dir.path))
        env["PYTHONPATH"] = hook + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if any(arg.endswith(WRAPPER_FILE) for arg in node.command):  # torchrun's wrapper, run from the run directory
        (run_dir.path / WRAPPER_FILE).write_text(TORCHRUN_SOURCE)
    out_path = run_dir.path / "torchrun.out"
    previous = interruption.catch_stop_signals()  # SIGTERM, SIGHUP too: torchrun's own session would outlive us
    with open(out_path, "wb") as out:
        # A session of its own: Ctrl-C reaches only us, and we stop torchrun (and so its workers) ourselves.
        try:
            proc = subprocess.Popen(list(node.command), cwd=node.cwd or None, env=env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as e:  # checked before the run directory was made, but a file can change since
            program = str(e.filename or node.command[0])
            reason = f"{program}: {e.strerror or e}"
            if isinstance(e, FileNotFoundError) and os.path.isfile(program):
                reason += " (the interpreter its #! line names)"
            run_dir.event("exited", node=0, exit_code=None, error=f"could not start torchrun: {reason}")
            interruption.restore_signals(previous)
            raise DdpctlError(f"could not start torchrun ({reason}): check --python; the attempt is recorded in "
                              f"{run_dir.path}") from None
    try:  # from here on, a Ctrl-C stops torchrun: it runs in a session of its own and would live on
        run_dir.update_record(local_pid=proc.pid, local_pid_start=start_time(proc.pid))  # start: its identity
        run_dir.event("started", node=0, pid=proc.pid, command=shown_argv(node.command))
        progress_file = run_dir.path / "progress.json"
        first_step = FirstStepWatch(out_path)
        node_watch = RunWatch.for_run([node.host.label], run_dir)  # hangs, low disk, the first rank failure
        stall = StallWatch(run_dir, FreshestProgress(1), stall_timeout,  # --stall-timeout, as on hosts
                           lambda: _local_stall_verdict(run_dir))
        with run_progress([node.host.label], enabled=show_progress) as progress:
            live = LiveOutput(run_dir, progress, show_output)  # rank 0's output, a script's progress, restarts
            while proc.poll() is None:
                record = live.local_record(read_json(progress_file))
                now = time.monotonic()
                stall.freshest.observe(0, record, now)
                stalled = stall.check(now)
                progress.update(0, record, first_step.state(record), stall_note(stalled) if record else "")
                node_watch.poll_here(True, None, record, now)
                time.sleep(POLL_SECONDS)
            downed = any(e.get("event") == DOWN_EVENT for e in run_dir.events())  # not a failure: `ddpctl down`
            if not downed:
                node_watch.poll_here(False, proc.returncode, None, time.monotonic())
            record = live.local_record(read_json(progress_file))
            progress.update(0, record, "stopped" if downed else "finished" if proc.returncode == 0 else "failed")
    except BaseException as exc:
        if isinstance(exc, RunStopRequested):  # --stall-timeout: stopped here as on hosts, with the same line
            run_dir.event("stop_requested", reason=str(exc))
            outcome = interruption.stop_and_pull(run_dir, lambda: _stop(proc, run_dir), None, cause=str(exc),
                                                 abandonable=False)
            run_dir.event("stopped", node=0, exit_code=proc.returncode, by=exc.reason)
            raise RunStopRequested(f"{exc}; {outcome.text}", exc.reason) from None
        if not interruption.interrupted_by(exc):
            _stop(proc, run_dir)  # an unexpected error must not leave torchrun running in its own session either
            raise

        def stop() -> None:
            _stop(proc, run_dir)
            run_dir.event("stopped", node=0, exit_code=proc.returncode)

        # Further signals during the stop are told that it goes on: the stop is bounded (SIGKILL after the grace).
        interruption.stop_and_pull(run_dir, stop, None, abandonable=False)
        return 130
    finally:
        interruption.restore_signals(previous)
    if downed:  # `ddpctl down` stopped it (and says so too)
        run_dir.event("stopped", node=0, exit_code=proc.returncode, by="down")
        raise RunStopRequested(f"run {run_dir.run_id} was stopped by `ddpctl down` (from another terminal); what "
                               f"it wrote is in {run_dir.path}", "down")
    run_dir.event("exited", node=0, exit_code=proc.returncode)
    return int(proc.returncode)


def _stop(proc: subprocess.Popen[bytes], run_dir: RunDir) -> None:
    """Stop torchrun and its workers as `ddpctl down` and a host node's stop do (launcher/remote/node_stop.py):
    SIGTERM to its tree and process group and to every process with the run's mark (torchrun stops its workers),
    SIGKILL after a grace period. The pid is still torchrun's: it is not reaped until proc.wait."""
    stop_processes(proc.pid, workspace_path(str(run_dir.path)), STOP_GRACE_SECONDS)
    proc.wait(timeout=10.0)


def _local_stall_verdict(run_dir: RunDir) -> str:
    """Where every rank of a stalled local run is (its stacks, taken here); imported only then: the stacks' module
    brings SSH's (paramiko), which a local run does not need (tests/test_launcher_alone.py)."""
    from launcher.execute.stacks import stall_verdict

    return stall_verdict(run_dir, None, [str(run_dir.path)])
