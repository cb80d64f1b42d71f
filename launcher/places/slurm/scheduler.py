"""Slurm through its login node over SSH: sbatch, scontrol and scancel (a job's state read in Slurm's words, its
phase from job_states.py).

`submit_dryrun` probes the cluster read-only (partition, GPUs, MaxTime, workdir, torch; then `sbatch --test-only`
with the very script) and builds the SlurmSubmit whose script `--dry-run` prints; the run
writes that file to the shared file system, byte for byte the same, and submits it with the same sbatch line in the
same command (job_files.py), whose answer `submitted_job_id` reads."""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.errors import DdpctlError, HostError, SpecError
from launcher.places.batch_job import JobStatus
from launcher.places.slurm import cluster, requeue
from launcher.places.slurm.batch_script import GPUS_PER_NODE, GRES, SlurmJob, batch_script, sbatch_argv
from launcher.places.slurm.job_states import job_status
from launcher.spec.run_spec import RunSpec
from launcher.spec.slurm_request import SlurmRequest
from launcher.transport.ssh import CommandResult, Connection

# Without a cluster to ask (--dry-run --no-probe): the run folder's place as the plan names it.
UNPROBED_WORKDIR = "$HOME/.ddpctl/slurm"


def unprobed_workdir(workdir: str | None) -> str:
    """The --workdir as the login node will read it, shown without asking it: `~` is its $HOME, a relative path is
    under it (the SSH session starts there), variables stay to be expanded there."""
    if workdir is None:
        return UNPROBED_WORKDIR
    if workdir == "~" or workdir.startswith("~/"):
        return "$HOME" + workdir[1:]
    return workdir if workdir.startswith(("/", "$", "~")) else f"$HOME/{workdir}"


@dataclass(frozen=True)
class SlurmSubmit:
    """What is submitted: the batch script (its text is the file written to the cluster) and the sbatch line."""

    job: SlurmJob
    script: str
    workdir: str  # the user's workdir on the cluster (absolute): runs/ and code/ live under it
    login: str
    unknown: tuple[str, ...] = ()  # what a dry run could not learn (no probe): such a request never runs
    warnings: tuple[str, ...] = ()  # what will likely not go as the user expects (the dry run says it)
    # The code cache's listing from the probe (tree_sync's JSON data), for shipping; not part of the request.
    code_listing: object = field(default=None, compare=False, repr=False)

    @property
    def remote_dir(self) -> str:
        return self.job.remote_dir

    @property
    def argv(self) -> list[str]:
        return sbatch_argv(self.job)

    def describe(self) -> str:
        """What --dry-run prints first: the sbatch line, then the batch script, byte for byte what is submitted."""
        return f"# sbatch line: {shlex.join(self.argv)}\n# {self.job.script_path}:\n" + self.script

    def notes(self) -> list[str]:
        """What --dry-run says beside the script (on stderr): the job in one line, what was not probed, warnings."""
        return [f"Slurm job on {self.login}: {self.job.spec.nnodes} node(s) x {self.job.spec.nproc_per_node} "
                f"process(es), run folder {self.remote_dir}",
                *(f"unknown: {u}" for u in self.unknown), *(f"warning: {w}" for w in self.warnings)]

    def to_json(self) -> dict[str, Any]:
        return {"scheduler": "slurm", "login": self.login, "remote_dir": self.remote_dir, "workdir": self.workdir,
                "sbatch": self.argv, "script": self.script, "gpu_flag": self.job.gpu_flag,
                "cpus_per_task": self.job.cpus_per_task, "unknown": list(self.unknown), "warnings": list(self.warnings),
                "partition": self.job.request.partition, "time": self.job.request.time,
                "requeue": requeue.plan_fields(self.job.request)}


class SlurmScheduler:
    """Slurm reached through a login node."""

    name = "slurm"

    def __init__(self, request: SlurmRequest, login: str) -> None:
        self.request = request
        self.login = login

    def submit_dryrun(self, spec: RunSpec, conn: Connection | None, code_cache: str | None = None) -> SlurmSubmit:
        """The exact submission (conn None: without asking the cluster, its facts named as unknown). `code_cache`:
        the code cache under the workdir that the probe lists too (launcher/places/slurm/cluster.py)."""
        refused = launcher_refusal(spec, self.request)
        if refused:
            raise SpecError(refused)
        refusal = requeue.refusal(spec, self.request)
        if refusal:
            raise SpecError(refusal)
        if spec.withheld_env:
            raise SpecError(f"the values of --env {', '.join(spec.withheld_env)} were not stored (run.json and "
                            "sweep.json keep names only): give --env NAME=VALUE for each again")
        warning = requeue.handler_warning(spec, self.request, Path.cwd())
        warnings = (warning,) if warning else ()
        if conn is None:  # the GPU request as a cons_tres cluster takes it; the probe decides it for the cluster
            workdir = unprobed_workdir(self.request.workdir)
            job = SlurmJob(spec, self.request, f"{workdir}/runs/{spec.run_id}", gpu_flag=GPUS_PER_NODE)
            unknown = ("the partition, its GPUs and MaxTime, the workdir and torch (not probed: --no-probe); the GPU "
                       "request is --gpus-per-node where Slurm runs select/cons_tres, else --gres=gpu:N, and on a "
                       "CPU-only partition --cpus-per-task=N instead",)
            return SlurmSubmit(job, batch_script(job), workdir, self.login, unknown, warnings)
        facts = cluster.read_facts(conn, spec, self.request, code_cache)
        has_gpus = any(facts.partition.gpus_per_node)
        gpu_flag = (GPUS_PER_NODE if facts.select_type.endswith("cons_tres") else GRES) if has_gpus else None
        request = self.request if self.request.partition else _with_partition(self.request, facts.partition.name)
        job = SlurmJob(spec, request, f"{facts.workdir}/runs/{spec.run_id}", gpu_flag=gpu_flag,
                       cpus_per_task=None if has_gpus or spec.launcher == "mpirun" else spec.nproc_per_node)
        default = cluster.default_gpus_note(spec, self.request, facts.partition)
        submit = SlurmSubmit(job, batch_script(job), facts.workdir, self.login,
                             warnings=warnings + ((default,) if default else ()), code_listing=facts.code_listing)
        # Slurm's own word before anything is written or told (the run's folder, its shipping): sbatch's refusal
        # in the submission itself would come after those, though it takes the files away (job_files.py).
        _test_only(conn, submit)
        return submit

    def describe(self, conn: Connection, job_id: str) -> JobStatus:
        """scontrol while Slurm remembers the job (MinJobAge), else sacct (accounting), else UNKNOWN."""
        result = conn.run(["scontrol", "show", "job", "-o", job_id], timeout=cluster.QUERY_TIMEOUT)
        if result.ok and result.stdout.strip():
            return status_from_scontrol(job_id, result.stdout.strip().splitlines()[0])
        acct = conn.run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o",
                         "State,ExitCode,Submit,Start,End,NodeList,AllocCPUS,Reason"], timeout=cluster.QUERY_TIMEOUT)
        if acct.ok and acct.stdout.strip():
            return status_from_sacct(job_id, acct.stdout.strip().splitlines()[0])
        return job_status(job_id, "UNKNOWN", reason=_last_line(result.stderr or acct.stderr))

    def allocation_spans(self, conn: Connection, job_id: str) -> list[tuple[float, float]] | None:
        """Each allocation's (start, end) of a job, requeued ones included (`sacct --duplicates`), from the
        cluster's accounting; None where there is none (sacct refuses or answers nothing)."""
        acct = conn.run(["sacct", "-j", job_id, "-X", "-D", "-n", "-P", "-o", "Start,End"],
                        timeout=cluster.QUERY_TIMEOUT)
        if not acct.ok:
            return None
        spans = []
        for line in acct.stdout.splitlines():
            start, _, end = line.strip().partition("|")
            began, ended = _clock(start), _clock(end)
            if began is not None and ended is not None:
                spans.append((began, ended))
        return spans or None

    def cancel(self, conn: Connection, job_id: str) -> None:
        """scancel: Slurm sends SIGTERM to every task, then SIGKILL after the cluster's KillWait."""
        result = conn.run(["scancel", job_id], timeout=cluster.QUERY_TIMEOUT)
        if not result.ok:
            raise HostError(conn.label, f"scancel {job_id} failed: {_last_line(result.stderr)}")


def launcher_refusal(spec: RunSpec, request: SlurmRequest) -> str:
    """Why the spec's --launcher cannot run as a Slurm job (empty: it can)."""
    if spec.launcher != "torchrun" and request.requeue:
        return (f"--requeue with --launcher {spec.launcher}: the time limit's signal is passed on to torchrun's "
                "workers only; your script's own processes would not get it: drop --requeue, or run the script "
                "under torchrun")
    return ""


def _with_partition(request: SlurmRequest, partition: str) -> SlurmRequest:
    from dataclasses import replace

    return replace(request, partition=partition)


def _test_only(conn: Connection, submit: SlurmSubmit) -> None:
    """`sbatch --test-only` with the very script: Slurm's own word on the account, QoS and options, submitting
    nothing. Its answer ("Job N to start at ...") goes to stderr, as do its refusals."""
    result = conn.run(["sbatch", "--test-only"], stdin=submit.script.encode(), timeout=cluster.QUERY_TIMEOUT)
    if not result.ok:
        raise DdpctlError(f"Slurm refuses the job (sbatch --test-only): {_last_line(result.stderr or result.stdout)}")


def submitted_job_id(label: str, result: CommandResult) -> str:
    """The job id in `sbatch --parsable`'s answer (`ID` or `ID;CLUSTER`); Slurm's refusal in one line."""
    if not result.ok:
        raise DdpctlError(f"Slurm refuses the job (sbatch): {_last_line(result.stderr or result.stdout)}")
    job_id = result.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise HostError(label, f"sbatch answered {result.stdout.strip()[:80]!r}, not a job id")
    return job_id


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1].removeprefix("sbatch: error: ") if lines else "no output"


def _clock(text: str) -> float | None:
    """Slurm's local timestamps (2026-11-25T15:29:27); None for Unknown/None/N/A."""
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def status_from_scontrol(job_id: str, line: str) -> JobStatus:
    """A JobStatus from `scontrol show job -o` (one line of Key=Value)."""
    kv = cluster.key_values(line)
    tres = dict(item.split("=", 1) for item in kv.get("TRES", "").split(",") if "=" in item)
    return job_status(job_id, kv.get("JobState", "UNKNOWN"), reason=kv.get("Reason", ""),
                     submit_time=_clock(kv.get("SubmitTime", "")), start_time=_clock(kv.get("StartTime", "")),
                     end_time=_clock(kv.get("EndTime", "")), exit_code=kv.get("ExitCode", ""),
                     nodes=kv.get("NodeList", ""), cpus=_int(kv.get("NumCPUs")), gpus=_int(tres.get("gres/gpu")),
                     restarts=_int(kv.get("Restarts")) or 0)


def status_from_sacct(job_id: str, line: str) -> JobStatus:
    """A JobStatus from `sacct -X -n -P -o State,ExitCode,Submit,Start,End,NodeList,AllocCPUS,Reason`."""
    fields = (line.split("|") + [""] * 8)[:8]
    state, _, by = fields[0].partition(" ")  # "CANCELLED by 1001"
    return job_status(job_id, state or "UNKNOWN", reason=by or fields[7], submit_time=_clock(fields[2]),
                     start_time=_clock(fields[3]), end_time=_clock(fields[4]), exit_code=fields[1], nodes=fields[5],
                     cpus=_int(fields[6]))


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
