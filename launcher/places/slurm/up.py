"""`up` through a batch scheduler (launcher/places/): the executor hands the run to the scheduler instead of
starting torchrun on each host. Login node over SSH (host key verified) -> read-only probe and the exact request
(`submit_dryrun`; `--dry-run` prints it) -> the run directory -> the code shipped once to the shared file system
(incremental, verified) -> the request's script written there and submitted, in one command -> follow the job
(pending with its reason, running with the trainer's progress) -> pull every node's folder (verified) -> the end
state, cost and failure (first failing rank) recorded."""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.errors import DdpctlError, Interrupted, PlanError, RunStopRequested
from launcher.execute.following import interruption
from launcher.execute.following.plain_progress import plain_output, run_progress
from launcher.execute.pull_record import pull_lock, write_pull_record
from launcher.execute.ship.contents import trainer_source_dir
from launcher.execute.ship.to_hosts import _cache_key, probed_listing
from launcher.places.batch_job import JobStatus
from launcher.places.slurm import requeue_chain
from launcher.places.slurm.job_files import place_and_submit
from launcher.places.slurm.job_states import PENDING, RUNNING
from launcher.places.slurm.rank0_output import Rank0Output
from launcher.places.slurm.saved_plan import MAKE_ONE, plan_json
from launcher.places.slurm.scheduler import SlurmScheduler, SlurmSubmit, submitted_job_id
from launcher.planning.request import UpOptions, UpResult
from launcher.remote import shell_text
from launcher.results.progress import console
from launcher.results.rundir import RunDir, primary_node_out, read_json, write_bytes_atomic, write_json_atomic
from launcher.spec.run_spec import RunSpec
from launcher.transport import outputs
from launcher.transport.hostsession import HostSession, target_to_json
from launcher.transport.pull import CHANGED, pull_tree
from launcher.transport.ssh import Connection
from launcher.transport.sync import ship_tree

if TYPE_CHECKING:
    from launcher.places.slurm.job_output import OomKill
    from launcher.places.slurm.job_stall import JobStallWatch
    from launcher.places.slurm.login_session import LoginSession

# What is needed only once the job is submitted (its end, its pull, its failure) is imported there, not on the way
# to sbatch: the time from the command to the job's first step is the time ddpctl is measured by
# (bench/bench_slurm.py).
POLL_SECONDS = 2.0
REQUEST_FILE = "plan.json"  # as on hosts: what was carried out, as `up --dry-run --json` prints it
# The progress records of every node in one answer: `NODE <k>` then its progress.json.
PROGRESS_SCRIPT = shell_text("slurm_progress.sh")  # launcher/remote/slurm_progress.sh: its argument there


def scheduler_for(options: UpOptions) -> SlurmScheduler:
    assert options.slurm is not None and options.hosts
    return SlurmScheduler(options.slurm, options.hosts[0].label)


def run_scheduled(spec: RunSpec, options: UpOptions, saved_script: str | None = None,
                  login: LoginSession | None = None) -> UpResult:
    """Submit the run to the scheduler and (unless --detach) follow it to its end state, then pull. `saved_script`:
    the batch script of a saved plan (`up --plan`), which the cluster must give again to be submitted. `login`: the
    session to the login node, already being opened (else it is opened here)."""
    scheduler = scheduler_for(options)
    if options.dry_run and not options.probe:
        assert login is None, "a dry run without probing asks nothing of the login node"
        unprobed = scheduler.submit_dryrun(spec, None)
        _print_request(unprobed, options)
        return UpResult(None, 0, None, scheduled_plan=plan_json(spec, scheduler.request, scheduler.login,
                                                                 unprobed.to_json()))
    # SFTP opens beside the probe (cluster.read_facts)
    with login.session() if login is not None else HostSession.open(options, sftp=False) as session:
        conn = session.conn(0)
        # Refusals (one line) come before anything is written; the probe lists the code cache for shipping too.
        request = scheduler.submit_dryrun(spec, conn, f"code/{_cache_key(code_source(spec))}")
        if options.dry_run:
            _print_request(request, options)
            return UpResult(None, 0, None, scheduled_plan=plan_json(spec, scheduler.request, scheduler.login,
                                                                     request.to_json()))
        for warning in request.warnings:  # a dry run says them with the request
            console.print(f"warning: {warning}", markup=False, highlight=False, soft_wrap=True)
        if saved_script is not None and request.script != saved_script:
            raise PlanError("the cluster no longer gives the saved plan's batch script (its partition, workdir or "
                            f"facts changed): {MAKE_ONE}")
        fields = {**options.record, "provider": "slurm", "hosts": [target_to_json(t) for t in session.targets],
                  "ssh": session.settings_json(), "slurm": {"login": request.login, "remote_dir": request.remote_dir,
                                                     **({"max_requeues": request.job.request.max_requeues}
                                                        if request.job.request.requeue else {})}}
        runs_dir_made = not options.runs_dir.exists()
        run_dir = RunDir.create(options.runs_dir, spec, fields)
        write_json_atomic(run_dir.path / REQUEST_FILE, request.to_json())
        with interruption_before_submit(run_dir, runs_dir_made):
            shipped = ship_code(conn, spec, request, run_dir)
            write_bytes_atomic(run_dir.path / "job.sbatch", request.script.encode())
            # A job is never submitted without its id being recorded; its files are placed in the same command.
            interruption.defer_signals()
            job_id = submitted_job_id(conn.label, place_and_submit(conn, request, *shipped))
            run_dir.update_record(slurm={**run_dir.record()["slurm"], "job_id": job_id})
            run_dir.event("submitted", job_id=job_id, sbatch=request.argv)
        console.print(f"submitted job {job_id} ({spec.nnodes} node(s) x {spec.nproc_per_node}) from {request.login}; "
                      f"its folder: {request.remote_dir}", markup=False, highlight=False)
        if options.detach:
            console.print(f"the job runs on without this terminal. Follow with `ddpctl status {spec.run_id}`; "
                          f"fetch with `ddpctl pull {spec.run_id}`", markup=False, highlight=False)
            return UpResult(run_dir.path, 0, None)
        try:
            interruption.act_on_deferred()
            status = follow_job(scheduler, conn, run_dir, job_id, show_progress=options.show_progress,
                                stall_timeout=options.stall_timeout)
        except BaseException as stop:
            if isinstance(stop, RunStopRequested):  # --stall-timeout (launcher/places/slurm/job_stall.py)
                raise stalled_job_stopped(scheduler, conn, run_dir, job_id, stop) from None
            if not interruption.interrupted_by(stop):
                raise
            outcome = interruption.stop_and_pull(run_dir, lambda: cancel_and_wait(scheduler, conn, job_id),
                                                 lambda: pull_job(conn, run_dir))
            raise Interrupted(outcome.text) from None
        interruption.pull_after_run(run_dir, lambda: pull_job(conn, run_dir))
        from launcher.results.planned_world import checked_exit_code

        code = finish_job(run_dir, status, scheduler.allocation_spans(conn, job_id))
        code = checked_exit_code(run_dir, read_json(run_dir.path / "summary.json"), code)  # the planned world?
        return UpResult(run_dir.path, code, read_json(run_dir.path / "summary.json"))


class interruption_before_submit:
    """Ctrl-C (or sbatch's refusal) before the job is submitted: nothing runs on the cluster; the run directory is
    removed, and the runs folder too where this run made it and nothing else is in it."""

    def __init__(self, run_dir: RunDir, runs_dir_made: bool = False) -> None:
        self.run_dir = run_dir
        self.runs_dir_made = runs_dir_made

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is not None and "job_id" not in self.run_dir.record().get("slurm", {}):
            import shutil

            shutil.rmtree(self.run_dir.path, ignore_errors=True)
            if self.runs_dir_made:
                with contextlib.suppress(OSError):  # not empty: another run's, kept
                    self.run_dir.path.parent.rmdir()
            if interruption.interrupted_by(exc):
                raise Interrupted(f"interrupted by {interruption.last_cause()} before the job was submitted: "
                                  "nothing was submitted") from None


def _print_request(request: SlurmSubmit, options: UpOptions) -> None:
    """The sbatch line and the batch script on stdout (or the request as JSON), the notes beside it on stderr."""
    print(json.dumps(request.to_json(), indent=2) if not options.show_progress else request.describe(), end="")
    if not options.show_progress:
        print()
    for note in request.notes():
        console.print(note, markup=False, highlight=False, soft_wrap=True)


def code_source(spec: RunSpec) -> Path:
    """What is shipped: the user's directory for a `-- CMD` run, else the trainer."""
    return Path.cwd() if spec.user_command else trainer_source_dir()


def ship_code(conn: Connection, spec: RunSpec, request: SlurmSubmit, run_dir: RunDir) -> tuple[str, str]:
    """The trainer (or the user's directory) to a cache in the workdir, sending only what changed (compared with
    the probe's listing of the cache); (the cache, where under the run's code/ it goes): copied there with the
    job's files, so every node reads the code the job was submitted with."""
    source = code_source(spec)
    if spec.user_command:
        dest = ""
        manifest, left_out = outputs.record_shipped(run_dir.path, source)
        console.print(outputs.shipping_note(source, manifest, left_out), markup=False, highlight=False, soft_wrap=True)
    else:
        dest = "/trainer"
    cache = f"{request.workdir}/code/{_cache_key(source)}"
    listed = probed_listing(conn.label, cache, request.code_listing)
    stats = ship_tree(conn, source, cache, python=spec.python, listed=listed)
    run_dir.event("shipped", node=0, **asdict(stats))
    return cache, dest


def follow_job(scheduler: SlurmScheduler, conn: Connection, run_dir: RunDir, job_id: str,
               show_progress: bool = True, stall_timeout: float = 0.0) -> JobStatus:
    """Poll until the job ends: say when it waits (Slurm's reason, time waited), starts, and how training goes,
    with rank 0's own output live under it (launcher/places/slurm/rank0_output.py). `stall_timeout`: raise
    RunStopRequested once the running job made no training step for that many seconds (0: never)."""
    from launcher.places.slurm.job_stall import JobStallWatch, node_records

    remote_dir = run_dir.record()["slurm"]["remote_dir"]
    spec = run_dir.spec()
    display = run_progress([f"job {job_id}"] * spec.nnodes, enabled=show_progress)
    stall = (JobStallWatch(run_dir, stall_timeout, spec.nnodes, lambda: node_records(conn, run_dir, remote_dir))
             if stall_timeout else None)
    with display:
        return _poll_job(scheduler, conn, run_dir, job_id, show_progress, Rank0Output(spec, remote_dir, display),
                         stall)


def _poll_job(scheduler: SlurmScheduler, conn: Connection, run_dir: RunDir, job_id: str, show_progress: bool,
              rank0: Rank0Output, stall: JobStallWatch | None = None) -> JobStatus:
    submitted, said, last_said_at = time.time(), "", 0.0
    remote_dir = run_dir.record()["slurm"]["remote_dir"]
    most = requeue_chain.max_requeues(run_dir)
    chain = requeue_chain.RequeueWatch(job_id, most) if most else None
    while True:
        status = scheduler.describe(conn, job_id)
        if status.finished and status.state != "UNKNOWN":
            return status
        if chain is not None:
            requeue_chain.note_submit_time(run_dir, status)
            requeued = chain.requeued_line(status)
            if requeued:
                run_dir.event("requeued", job_id=job_id, requeues=status.restarts, max_requeues=most)
                if show_progress and not plain_output():  # plain output tells the event itself
                    console.print(requeued, markup=False, highlight=False)
                submitted = time.time()  # the next allocation's wait starts now
        if stall is not None:  # PENDING never counts (launcher/places/slurm/job_stall.py)
            stall.check(status.state, time.monotonic())
        allocation = chain.allocation(status) if chain is not None else ""
        if status.state == PENDING:
            line = (f"job {job_id}{allocation} pending: "
                    f"{status.reason if status.reason not in ('', 'None') else 'waiting'}")
        elif status.state == RUNNING:
            rank0.poll(conn, status.nodes)
            line = f"job {job_id}{allocation} running on {status.nodes}" + _progress_text(conn, remote_dir)
        else:
            line = f"job {job_id} {status.state.lower()}"
        now = time.time()
        if line != said or now - last_said_at > 30:
            if line.split(":")[0] != said.split(":")[0]:
                run_dir.event("job_state", state=status.state, reason=status.reason, nodes=status.nodes)
                rank0.job_state(status.state)
            if show_progress:
                waited = f" (waited {now - submitted:.0f} s)" if status.state == PENDING else ""
                console.print(line + waited, markup=False, highlight=False)
            said, last_said_at = line, now
        time.sleep(POLL_SECONDS)


def _progress_text(conn: Connection, remote_dir: str) -> str:
    """`: epoch E/N, step S/M` from the newest progress record of any node (rank 0's node writes one)."""
    result = conn.run(["sh", "-c", PROGRESS_SCRIPT, "ddpctl-progress", remote_dir], timeout=30)
    records = []
    for chunk in result.stdout.split("NODE ")[1:]:
        try:
            records.append(json.loads(chunk.split("\n", 1)[1]))
        except (ValueError, IndexError):
            continue
    if not records:
        return ""
    p = max(records, key=lambda r: r.get("time") or 0)
    return f": epoch {p.get('epoch')}/{p.get('epochs')}, step {p.get('step')}/{p.get('steps_per_epoch')}"


def stalled_job_stopped(scheduler: SlurmScheduler, conn: Connection, run_dir: RunDir, job_id: str,
                        stop: RunStopRequested) -> RunStopRequested:
    """A job stopped for --stall-timeout: cancelled, pulled and its end recorded as `down` does; the error."""
    from launcher.places.slurm.job_stall import stop_stalled_job

    error = stop_stalled_job(run_dir, stop, lambda: cancel_and_wait(scheduler, conn, job_id),
                             lambda: pull_job(conn, run_dir))
    status = scheduler.describe(conn, job_id)
    if status.finished:
        finish_job(run_dir, status, scheduler.allocation_spans(conn, job_id))
    return error


def cancel_and_wait(scheduler: SlurmScheduler, conn: Connection, job_id: str, timeout: float = 120) -> None:
    """scancel (SIGTERM first, SIGKILL after the cluster's KillWait), then wait until Slurm says it ended."""
    scheduler.cancel(conn, job_id)
    deadline = time.monotonic() + timeout
    while not scheduler.describe(conn, job_id).finished:
        if time.monotonic() > deadline:
            raise DdpctlError(f"job {job_id} did not end within {timeout:.0f} s of scancel")
        time.sleep(1)


def pull_job(conn: Connection, run_dir: RunDir) -> list[dict[str, Any]]:
    """Every node's folder (out/, logs/, torchrun.out, exit_code) into nodes/<k>/ and the job's own output to
    the top, each file verified; then rank 0's node's records to the top, as after a host run."""
    from launcher.execute.hosts.run import PULL_ATTEMPTS, PULLED, TOP_LEVEL_FILES

    spec, record = run_dir.spec(), run_dir.record()
    remote_dir = record["slurm"]["remote_dir"]
    shipped, patterns = outputs.load_shipped(run_dir.path), outputs.recorded_outputs(record)
    stats: list[dict[str, Any]] = []
    with pull_lock(run_dir.path, run_dir.run_id):
        for node in range(spec.nnodes):
            workspace = f"{remote_dir}/nodes/{node}"
            local = run_dir.path / "nodes" / str(node)
            # A running job rewrites progress.json and its logs: a file caught mid-change is fetched again (what
            # was verified is not), a few times, then named, as on hosts (launcher/execute/hosts/run.py: pull_run).
            for _attempt in range(PULL_ATTEMPTS):
                pulled = pull_tree(conn, workspace, local, include=PULLED, missing_ok=True, python=spec.python)
                merged = asdict(pulled)
                if shipped is not None:
                    written = outputs.pull_workdir(conn, workspace, local, shipped, patterns, spec.python)
                    merged = outputs.merged_stats(pulled, written)
                if all(why != CHANGED for _path, why in merged["not_pulled"]):
                    break
            stats.append(merged)
            run_dir.event("pulled", node=node, **merged)
        write_pull_record(run_dir.path, [f"node {k}" for k in range(spec.nnodes)], list(stats), [None] * len(stats))
        pull_tree(conn, remote_dir, run_dir.path, include=["/slurm-*.out", requeue_chain.PULLED], missing_ok=True,
                  python=spec.python)
        primary = primary_node_out(run_dir.path, spec.nnodes)
        for name in TOP_LEVEL_FILES:
            if primary and (primary / name).is_file():
                write_bytes_atomic(run_dir.path / name, (primary / name).read_bytes())
        if shipped is not None:
            outputs.mirror_rank0(run_dir.path, outputs.rank0_node(record, primary))
    return stats


def finish_job(run_dir: RunDir, status: JobStatus, slurm_spans: list[tuple[float, float]] | None = None) -> int:
    """Record the end state (one line), the allocation's cost and the failure; the run's exit code. `slurm_spans`:
    each allocation's (start, end) from Slurm's accounting, where the cluster keeps it."""
    from launcher.execute.failures.cause import record_failure
    from launcher.places.slurm import job_end
    from launcher.results.run_records import finish_records

    queued = _span(status.submit_time, status.start_time)
    ran = _span(status.start_time, status.end_time)
    cost = {"queued_seconds": queued, "run_seconds": ran,
            "cpu_hours": round(status.cpus * ran / 3600, 4) if status.cpus and ran is not None else None,
            "gpu_hours": round(status.gpus * ran / 3600, 4) if status.gpus and ran is not None else None}
    oom = job_end.step_oom(run_dir.path, status)
    line, spent = end_line(status, queued, ran, oom), False
    most = requeue_chain.max_requeues(run_dir)
    if most:  # a chain of allocations: counted over all of them, and the outcome once no requeue was left
        cost, chain = requeue_chain.cost(run_dir, status, requeue_chain.submit_time(run_dir), slurm_spans)
        user_command = bool(run_dir.spec().user_command)
        saved = requeue_chain.saved_text(run_dir, user_command)
        line = requeue_chain.end_line(status, cost, chain, most, saved, user_command)
        spent = requeue_chain.spent(status, chain)
    run_dir.update_record(slurm={**run_dir.record()["slurm"], "status": status.to_json(), "end": line, **cost})
    run_dir.event("job_ended", state=status.state, exit_code=status.exit_code, line=line)
    finish_records(run_dir)
    console.print(line, markup=False, highlight=False)
    if status.state == "COMPLETED":
        return 0
    failure = job_end.job_failure(run_dir, status, line, oom)
    if spent:  # the job stopped itself, every node ended 0: the time limit with no requeue left is the cause
        failure = {"summary": line, "node": None, "rank": None, "slurm_state": status.state,
                   "nodes": failure.get("nodes", []), "requeues_spent": most}
    record_failure(run_dir, failure)
    return 1


def end_line(status: JobStatus, queued: float | None, ran: float | None, oom: OomKill | None = None) -> str:
    """`job 12 COMPLETED (exit 0:0) after 41 s running, 2 s queued` and the like, one line per end state."""
    from launcher.places.slurm import job_end

    times = ", ".join(t for t in (f"{ran:.0f} s running" if ran is not None else "",
                                  f"{queued:.0f} s queued" if queued is not None else "") if t)
    state = job_end.named_state(status, oom)
    how = {"TIMEOUT": "hit its time limit", "NODE_FAIL": "lost a node", "OUT_OF_MEMORY": "ran out of memory",
           "PREEMPTED": "was preempted", "CANCELLED": "was cancelled"}.get(state, "")
    if oom is not None and state == "OUT_OF_MEMORY":
        step = f"step {oom.step}" if oom.step else "a step"
        how = f"{step} ran out of memory" + (f" on {oom.node}" if oom.node else "") + (
            f" (Slurm's job state: {status.state})" if status.state != state else "")
    by = f" ({status.reason})" if status.state == "CANCELLED" and status.reason not in ("", "None") else ""
    return (f"job {status.job_id} {state}" + (f": {how}{by}" if how else "") +
            f" (exit {status.exit_code or '?'})" + (f" after {times}" if times else ""))


def _span(start: float | None, end: float | None) -> float | None:
    return round(end - start, 1) if start is not None and end is not None and end >= start else None
