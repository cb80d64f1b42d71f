"""Training past the time limit (`--requeue`, `--max-requeues N`): the batch script's lines for it, built from the
request by pure functions and tested as text, and the job's own record of its allocations, read back by ddpctl.

How the signal travels, and why this way (docs/guides/slurm.md, "Training past the time limit"):
- Slurm signals the batch shell alone (`--signal=B:USR1@NOTICE`): one process, on every cluster, whatever its
  process tracking. Signals Slurm sends to a step go to the step's processes as its proctrack plugin finds them:
  with proctrack/pgid, torchrun's workers (each in a session of its own) are not among them.
- The batch shell (srun runs in the background, so the trap runs at once) creates the flag file, then signals
  srun, which passes SIGUSR1 on to every node's task.
- Each node's shell passes it on to torchrun's children, the workers, itself. torchrun was started with SIGUSR1
  ignored (its default action would end torchrun, leaving its workers behind); the workers inherit that, and our
  trainer (trainer/requeue.py) or the user's script installs its own handler. A worker may get it twice (directly
  from Slurm where proctrack finds it, and from its node's shell): a handler only sets a flag.
- The workers finish their step, save, create the requeue mark (DDPCTL_REQUEUE_MARK, requeue/resume) and exit 0;
  torchrun ends 0 (a non-zero status would make it restart the workers, and srun's --kill-on-bad-exit end the
  other nodes mid-save).
- The decision is made after srun ends, from how the step ended, never in the trap: requeue when every node ended
  0 and the mark exists (the script said "I saved because of the signal: run me again"). A signal that lands as a
  script finishes (its work done, exiting 0, no mark) requeues nothing: the script finished. Every rank that
  stopped creates the mark (one file; on the shared file system the batch shell's own node then sees its own
  rank's creation, whatever the other nodes' attribute caches say).

The job appends its own record to requeue/chain in the run's folder, one line per event, `COUNT EVENT UNIXTIME
[DETAIL]` (COUNT: requeues before this allocation, Slurm's SLURM_RESTART_COUNT): start (DETAIL: its nodes),
signal, end (DETAIL: srun's status), requeue, norequeue (scontrol requeue failed), spent (the last allowed requeue
was used), finished (the signal came and the step ended 0 with no mark: taken as finished). After spent or
norequeue the job ends with EXIT_REQUEUES_SPENT. ddpctl reads it to follow the chain and to count allocations,
time queued and trained."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from launcher.spec.run_spec import RunSpec
from launcher.spec.script_look import script_of
from launcher.spec.slurm_request import SlurmRequest, time_minutes

SIGNAL = "USR1"
NOTICE_MAX_SECONDS = 300  # asked this long before the limit, or half the limit when that is shorter
EXIT_REQUEUES_SPENT = 75  # sysexits' EX_TEMPFAIL: stopped for want of time, its snapshot saved; not a failure
CHAIN_FILE = "requeue/chain"
TRAINER_STRATEGIES = ("ddp",)  # as trainer/requeue.py's STRATEGIES
FLAG_FILE = "requeue/signalled"
# What a script creates (any rank, any number of times) to say it saved because of the signal and wants the next
# allocation: without it, a step that ended 0 finished, whenever the signal came.
MARK_FILE = "requeue/resume"
MARK_ENV = "DDPCTL_REQUEUE_MARK"  # as trainer/requeue.py's MARK_ENV


def notice_seconds(request: SlurmRequest) -> int:
    """Seconds before the time limit at which the signal is asked. Slurm checks limits every 30 s and may send it
    up to that much earlier; half a one-minute limit still leaves 30 s between the signal and the end."""
    assert request.time is not None
    return int(min(NOTICE_MAX_SECONDS, time_minutes(request.time) * 60 / 2))


def plan_fields(request: SlurmRequest) -> dict[str, object] | None:
    """What the plan records of it (None: the job ends at its time limit)."""
    if not request.requeue:
        return None
    return {"max_requeues": request.max_requeues, "signal": SIGNAL, "notice_seconds": notice_seconds(request),
            "directives": directives(request)}


def refusal(spec: RunSpec, request: SlurmRequest) -> str:
    """Why this run cannot be requeued (empty: it can): our trainer stops mid-epoch with the ddp strategy only."""
    if request.requeue and not spec.user_command and spec.strategy not in TRAINER_STRATEGIES:
        return (f"--requeue with --strategy {spec.strategy}: only the ddp strategy stops and resumes mid-epoch on the "
                "time limit's signal; drop --requeue or use --strategy ddp")
    return ""


def handler_warning(spec: RunSpec, request: SlurmRequest, cwd: Path) -> str:
    """A warning (empty: none) when `--requeue` meets a `-- CMD` script with no SIGUSR1 handler in sight: a plain
    look at the script's own source for `signal.signal` / `SIGUSR1` (what it imports is not read)."""
    if not request.requeue or not spec.user_command:
        return ""
    path = script_of(spec.user_command, cwd)
    if path is None or not path.is_file():
        return ""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    if "SIGUSR1" in text or "signal.signal" in text or "signal(" in text:
        if MARK_ENV in text:
            return ""
        return (f"--requeue: {path.name} handles a signal but never names {MARK_ENV}: after the time limit's signal, "
                f"a command that ends 0 without creating that file is taken as finished and not requeued. Create it "
                f"when you stop to resume later (examples/slurm_requeue.py; docs/guides/slurm.md, 'A script of your "
                "own')")
    return (f"--requeue: {path.name} has no SIG{SIGNAL} handler in sight (no signal.signal or SIGUSR1 in it): the "
            f"time limit's signal will be ignored and the job end in TIMEOUT, not requeued. Add a handler that saves, "
            f"creates the file ${MARK_ENV} names and exits 0 (examples/slurm_requeue.py; docs/guides/slurm.md, 'A "
            "script of your own')")


def directives(request: SlurmRequest) -> list[str]:
    """The #SBATCH options of a requeued run (in place of --no-requeue)."""
    return ["--requeue", f"--signal=B:{SIGNAL}@{notice_seconds(request)}"]


def environment_lines(request: SlurmRequest) -> list[str]:
    """What every node's command is told (docs/guides/slurm.md lists these), and the allocation's first record."""
    return [
        f"# --requeue: Slurm signals this shell ({SIGNAL}) {notice_seconds(request)} s before the time limit; it is "
        "passed on to every node's command, which saves and stops;",
        f"# the job then requeues itself (at most {request.max_requeues} times) and the next allocation resumes.",
        f'export DDPCTL_REQUEUE_SIGNAL={SIGNAL} DDPCTL_REQUEUE_NOTICE={notice_seconds(request)} '
        f'DDPCTL_MAX_REQUEUES={request.max_requeues} DDPCTL_REQUEUE_FLAG="$PWD/{FLAG_FILE}" '
        f'DDPCTL_REQUEUE_MARK="$PWD/{MARK_FILE}"',
        'export DDPCTL_REQUEUE_COUNT="${SLURM_RESTART_COUNT:-0}"',
        'mkdir -p requeue && rm -f "$DDPCTL_REQUEUE_FLAG" "$DDPCTL_REQUEUE_MARK"',
        f'echo "$DDPCTL_REQUEUE_COUNT start $(date +%s) $SLURM_JOB_NODELIST" >> {CHAIN_FILE}',
        # wait is cut short by a trapped signal: wait again until the child is gone, then once more for its status.
        'wait_for() { while kill -0 "$1" 2>/dev/null; do wait "$1"; done; wait "$1"; }',
    ]


def batch_run_lines(srun_line: str, request: SlurmRequest) -> list[str]:
    """srun in the background (the trap only records the signal and passes it on, so it runs at once); once srun
    ends, requeue when it ended 0 and the script left the mark, else pass its status on."""
    n = request.max_requeues
    return [
        f'on_signal() {{ date +%s > "$DDPCTL_REQUEUE_FLAG"; echo "$DDPCTL_REQUEUE_COUNT signal $(date +%s)" >> '
        f'{CHAIN_FILE}; echo "ddpctl: SIG{SIGNAL}: the time limit is near; passed on to every node"; '
        'if [ -n "$srun_pid" ]; then forwarded=1; kill -USR1 "$srun_pid" 2>/dev/null || true; fi; }',
        "srun_pid= forwarded=",
        f"trap on_signal {SIGNAL}",
        f"{srun_line} &",
        "srun_pid=$!",
        # A signal that came between srun's start and `$!` (its pid still unknown to the trap) is passed on now.
        'if [ -f "$DDPCTL_REQUEUE_FLAG" ] && [ -z "$forwarded" ]; then forwarded=1; kill -USR1 "$srun_pid" '
        "2>/dev/null || true; fi",
        'status=0; wait_for "$srun_pid" || status=$?',
        f"trap '' {SIGNAL}  # from here on the step's end decides, whatever comes",
        f'echo "$DDPCTL_REQUEUE_COUNT end $(date +%s) $status" >> {CHAIN_FILE}',
        'if [ "$status" = 0 ] && [ -f "$DDPCTL_REQUEUE_MARK" ]; then',
        f'  if [ "$DDPCTL_REQUEUE_COUNT" -lt {n} ]; then',
        f'    echo "$DDPCTL_REQUEUE_COUNT requeue $(date +%s)" >> {CHAIN_FILE}',
        f'    echo "ddpctl: requeued ($((DDPCTL_REQUEUE_COUNT + 1))/{n}) at the time limit"',
        '    scontrol requeue "$SLURM_JOB_ID" && exit 0',
        f'    echo "$DDPCTL_REQUEUE_COUNT norequeue $(date +%s)" >> {CHAIN_FILE}',
        '    echo "ddpctl: scontrol requeue failed: the job ends here, its snapshot saved"',
        "  else",
        f'    echo "$DDPCTL_REQUEUE_COUNT spent $(date +%s)" >> {CHAIN_FILE}',
        f'    echo "ddpctl: the time limit came after {n} requeue(s) (--max-requeues {n}): stopped, snapshot saved"',
        "  fi",
        f"  exit {EXIT_REQUEUES_SPENT}",
        "fi",
        'if [ "$status" = 0 ] && [ -f "$DDPCTL_REQUEUE_FLAG" ]; then',
        f'  echo "$DDPCTL_REQUEUE_COUNT finished $(date +%s)" >> {CHAIN_FILE}',
        f'  echo "ddpctl: SIG{SIGNAL} came, and every node ended 0 without the requeue mark: finished, not requeued"',
        "fi",
        'exit "$status"',
    ]


def node_run_lines(command_line: str, output: str) -> list[str]:
    """A node's command with SIGUSR1 ignored by torchrun and passed on to its workers by this shell."""
    return [
        'stop_workers() { [ -n "$stopping" ] && return; stopping=1; pkill -USR1 -P "$runner" 2>/dev/null || true; }',
        f"trap stop_workers {SIGNAL}",
        'wait_for() { while kill -0 "$1" 2>/dev/null; do wait "$1"; done; wait "$1"; }',
        f"( trap '' {SIGNAL}; exec {command_line} ) >> {output} 2>&1 < /dev/null &",
        "runner=$!",
        'code=0; wait_for "$runner" || code=$?',
    ]


@dataclass
class Allocation:
    """One allocation of a requeued job, as the job recorded it (unix times)."""

    count: int
    start: float
    nodes: str = ""
    end: float | None = None
    status: int | None = None
    signalled: float | None = None
    requeued: bool = False
    spent: bool = False
    finished: bool = False  # signalled, ended 0 with no requeue mark: taken as finished


@dataclass
class Chain:
    """The allocations of one job, oldest first."""

    allocations: list[Allocation] = field(default_factory=list)

    @classmethod
    def parse(cls, text: str) -> Chain:
        chain = cls()
        for line in text.splitlines():
            words = line.split(maxsplit=3)
            if len(words) < 3 or not words[0].isdigit():
                continue
            try:
                count, event, when = int(words[0]), words[1], float(words[2])
            except ValueError:
                continue
            detail = words[3] if len(words) > 3 else ""
            if event == "start":
                chain.allocations.append(Allocation(count, when, nodes=detail))
                continue
            current = chain.allocations[-1] if chain.allocations else None
            if current is None or current.count != count:
                continue
            if event == "end":
                current.end, current.status = when, int(detail) if detail.lstrip("-").isdigit() else None
            elif event == "signal":
                current.signalled = when
            elif event in ("requeue", "norequeue"):
                current.requeued = event == "requeue"
            elif event == "spent":
                current.spent = True
            elif event == "finished":
                current.finished = True
        return chain

    @property
    def requeues(self) -> int:
        return sum(1 for a in self.allocations if a.requeued)

    @property
    def spent(self) -> bool:
        return any(a.spent for a in self.allocations)

    def trained_seconds(self, now: float | None = None) -> float:
        """Time in allocations (each from its start to its end, or to `now` while it runs)."""
        total = 0.0
        for a in self.allocations:
            end = a.end if a.end is not None else now
            if end is not None:
                total += max(0.0, end - a.start)
        return total

    def queued_seconds(self, submitted: float | None) -> float | None:
        """Time waiting: before the first allocation, and between each allocation's end and the next start."""
        if submitted is None or not self.allocations:
            return None
        waits = [self.allocations[0].start - submitted]
        for before, after in zip(self.allocations, self.allocations[1:], strict=False):
            if before.end is not None:
                waits.append(after.start - before.end)
        return max(0.0, sum(waits))
