"""`--requeue` as text and records (pure): the batch script's signal and requeue lines, the options' validation, the
plan's record of them, the job's own record of its allocations, and the lines ddpctl tells from them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from launcher.errors import SpecError
from launcher.places.slurm import requeue, requeue_chain
from launcher.places.slurm.batch_script import SlurmJob, batch_script
from launcher.places.slurm.job_states import job_status
from launcher.places.slurm.requeue import Chain
from launcher.places.slurm.scheduler import SlurmScheduler, SlurmSubmit
from launcher.spec.run_spec import RunSpec
from launcher.spec.slurm_request import DEFAULT_MAX_REQUEUES, SlurmRequest, max_requeues_asked
from launcher.transport.ssh import CommandResult

RUN = "/scratch/u/ddpctl/runs/r1"
SPEC = RunSpec(run_id="r1", nnodes=2, nproc_per_node=4, python="python3", epochs=2)


def script(spec: RunSpec = SPEC, **request: object) -> str:
    return batch_script(SlurmJob(spec, SlurmRequest(nodes=spec.nnodes, **request), RUN, gpu_flag=None))  # type: ignore[arg-type]


def test_a_requeued_run_asks_for_the_signal_and_the_requeue_instead_of_no_requeue() -> None:
    text = script(time="4:00:00", max_requeues=3)
    assert "#SBATCH --open-mode=append\n#SBATCH --requeue\n#SBATCH --signal=B:USR1@300\n" in text
    assert "--no-requeue" not in text
    plain = script(time="4:00:00")
    assert "#SBATCH --no-requeue\n" in plain and "USR1" not in plain and "DDPCTL_REQUEUE" not in plain


@pytest.mark.parametrize(("time", "notice"), [("1", 30), ("2", 60), ("10", 300), ("2-00:00:00", 300)])
def test_the_notice_is_half_the_limit_up_to_five_minutes(time: str, notice: int) -> None:
    assert requeue.notice_seconds(SlurmRequest(time=time, max_requeues=1)) == notice
    assert f"#SBATCH --signal=B:USR1@{notice}\n" in script(time=time, max_requeues=1)


def test_the_batch_shell_passes_the_signal_on_and_requeues_itself_at_most_n_times() -> None:
    text = script(time="1", max_requeues=3)
    # What the nodes' commands are told, and the allocation's first record.
    assert ('export DDPCTL_REQUEUE_SIGNAL=USR1 DDPCTL_REQUEUE_NOTICE=30 DDPCTL_MAX_REQUEUES=3 '
            'DDPCTL_REQUEUE_FLAG="$PWD/requeue/signalled" DDPCTL_REQUEUE_MARK="$PWD/requeue/resume"\n'
            'export DDPCTL_REQUEUE_COUNT="${SLURM_RESTART_COUNT:-0}"\n'
            'mkdir -p requeue && rm -f "$DDPCTL_REQUEUE_FLAG" "$DDPCTL_REQUEUE_MARK"\n'
            'echo "$DDPCTL_REQUEUE_COUNT start $(date +%s) $SLURM_JOB_NODELIST" >> requeue/chain\n') in text
    # srun runs in the background so that the trap runs at once; the trap flags and passes the signal to srun.
    assert "trap on_signal USR1\nsrun --nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c \"$node_script\" &\n"\
        "srun_pid=$!\n" in text
    assert 'date +%s > "$DDPCTL_REQUEUE_FLAG"' in text and 'kill -USR1 "$srun_pid"' in text
    # Decided once srun ended, from how it ended: requeued only when every node ended 0 and the mark was left.
    assert ('status=0; wait_for "$srun_pid" || status=$?\ntrap \'\' USR1  ') in text
    assert ('if [ "$status" = 0 ] && [ -f "$DDPCTL_REQUEUE_MARK" ]; then\n'
            '  if [ "$DDPCTL_REQUEUE_COUNT" -lt 3 ]; then\n') in text
    assert "summary.json" not in text
    assert '    scontrol requeue "$SLURM_JOB_ID" && exit 0\n' in text
    assert "  exit 75\nfi\n" in text and text.endswith('not requeued"\nfi\nexit "$status"\n')


# The batch shell's own lines after its set-up, run by bash in a folder standing in for the run's: `srun` is a
# command of the test's (the step: what it does, how it ends) and `scontrol` records the requeue it is asked for.
def run_batch_lines(tmp_path: Path, step: str, count: int = 0) -> tuple[int, str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "scontrol").write_text('#!/bin/sh\necho "$@" >> "$PWD/scontrol.calls"\n')
    (bin_dir / "scontrol").chmod(0o755)
    request = SlurmRequest(time="1", max_requeues=2)
    lines = [line for line in requeue.environment_lines(request) if not line.startswith("#")]
    text = "\n".join([*lines, *requeue.batch_run_lines(step, request)]) + "\n"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "12", "SLURM_RESTART_COUNT": str(count),
           "SLURM_JOB_NODELIST": "n1"}
    done = subprocess.run(["bash", "-c", text], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    calls = tmp_path / "scontrol.calls"
    return done.returncode, (tmp_path / "requeue" / "chain").read_text(), calls.read_text() if calls.exists() else ""


# The signal comes while the step runs (the batch shell's trap), then the step ends as each case says. `$PPID` of
# the step, run in the background, is the batch shell; the step waits until the trap passed the signal on.
SIGNALLED = "bash -c 'trap \"touch passed\" USR1; kill -USR1 $PPID; while [ ! -e passed ]; do sleep 0.05; done; {}'"


@pytest.mark.integration  # bash runs the lines
@pytest.mark.parametrize(("step", "requeued", "code", "last_event"), [
    # Stopped for the signal, saved, said so: requeued.
    (SIGNALLED.format('touch \"$DDPCTL_REQUEUE_MARK\"; exit 0'), True, 0, "requeue"),
    # The race: the signal lands as the step finishes; it ends 0 with no mark: finished, not run again.
    (SIGNALLED.format("exit 0"), False, 0, "finished"),
    # A node failed: its status is passed on, mark or not.
    (SIGNALLED.format('touch \"$DDPCTL_REQUEUE_MARK\"; exit 3'), False, 3, "end"),
    # No signal, no mark: a plain end.
    ("true", False, 0, "end"),
])
def test_the_requeue_is_decided_from_how_the_step_ended(tmp_path: Path, step: str, requeued: bool, code: int,
                                                        last_event: str) -> None:
    returncode, chain, calls = run_batch_lines(tmp_path, step)
    assert returncode == code, chain
    assert (calls == "requeue 12\n") is requeued and (calls == "") is not requeued
    assert chain.splitlines()[-1].split()[1] == last_event, chain
    parsed = Chain.parse(chain).allocations[-1]
    assert (parsed.requeued, parsed.finished) == (requeued, last_event == "finished")


@pytest.mark.integration
def test_a_mark_left_by_an_earlier_allocation_does_not_requeue_the_next(tmp_path: Path) -> None:
    (tmp_path / "requeue").mkdir()
    (tmp_path / "requeue" / "resume").touch()
    (tmp_path / "requeue" / "signalled").touch()
    assert run_batch_lines(tmp_path, "true", count=1)[2] == ""


@pytest.mark.integration
def test_the_mark_with_no_requeue_left_ends_as_spent(tmp_path: Path) -> None:
    returncode, chain, calls = run_batch_lines(tmp_path, SIGNALLED.format('touch \"$DDPCTL_REQUEUE_MARK\"'), count=2)
    assert (returncode, calls, chain.splitlines()[-1].split()[:2]) == (75, "", ["2", "spent"])


def test_each_node_ignores_the_signal_in_torchrun_and_passes_it_to_the_workers() -> None:
    text = script(time="1", max_requeues=1)
    node = text.split("<<'NODE' || true\n")[1].split("\nNODE\n")[0]
    assert 'pkill -USR1 -P "$runner"' in node and "trap stop_workers USR1\n" in node
    assert "( trap '' USR1; exec python3 \"$DDPCTL_TORCHRUN\" --nnodes 2 " in node
    assert ' ) >> "$ws/torchrun.out" 2>&1 < /dev/null &\nrunner=$!\ncode=0; wait_for "$runner" || code=$?\n' in node


def test_a_requeued_users_script_keeps_its_copy_and_is_requeued_by_the_trainers_rule() -> None:
    spec = RunSpec(run_id="r2", nnodes=1, nproc_per_node=1, python="python3", user_command=("python", "loop.py"))
    text = script(spec, time="1", max_requeues=2)
    assert '[ -d "$ws/code" ] || cp -R code "$ws/code"\n' in text and 'rm -rf "$ws/code"' not in text
    assert 'if [ "$status" = 0 ] && [ -f "$DDPCTL_REQUEUE_MARK" ]; then\n' in text


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"max_requeues": 2}, "--requeue needs --time"),
    ({"max_requeues": 1001, "time": "10"}, "--max-requeues 1001: give 1 to 1000"),
    ({"max_requeues": 1, "time": "0:30"}, "--requeue needs a limit of at least a minute"),
    ({"sbatch_options": ("--signal=USR2@60",)}, "ddpctl sets --signal itself"),
])
def test_bad_requeue_requests_are_refused_in_one_line(kwargs: dict[str, object], named: str) -> None:
    with pytest.raises(SpecError, match=named.replace("(", r"\(").replace(")", r"\)")):
        SlurmRequest(**kwargs)  # type: ignore[arg-type]


def test_requeue_and_max_requeues_flags() -> None:
    assert max_requeues_asked(None, None) == 0 and max_requeues_asked(False, None) == 0
    assert max_requeues_asked(True, None) == DEFAULT_MAX_REQUEUES == 10
    assert max_requeues_asked(None, 4) == 4 == max_requeues_asked(True, 4)
    with pytest.raises(SpecError, match="--max-requeues 0: give 1 or more"):
        max_requeues_asked(True, 0)


def test_only_the_ddp_strategy_of_our_trainer_is_requeued() -> None:
    request = SlurmRequest(time="10", max_requeues=1)
    assert requeue.refusal(SPEC, request) == ""
    assert "--strategy local-sgd" in requeue.refusal(RunSpec(run_id="r", strategy="local-sgd", nproc_per_node=2),
                                                      request)
    assert requeue.refusal(RunSpec(run_id="r", strategy="local-sgd", nproc_per_node=2), SlurmRequest()) == ""


def test_the_plan_records_the_signal_and_the_requeue() -> None:
    request = SlurmRequest(nodes=2, time="1", max_requeues=3)
    job = SlurmJob(SPEC, request, RUN, gpu_flag=None)
    plan = SlurmSubmit(job, batch_script(job), "/scratch/u/ddpctl", "login").to_json()
    assert plan["requeue"] == {"max_requeues": 3, "signal": "USR1", "notice_seconds": 30,
                               "directives": ["--requeue", "--signal=B:USR1@30"]}
    job = SlurmJob(SPEC, SlurmRequest(nodes=2), RUN, gpu_flag=None)
    assert SlurmSubmit(job, batch_script(job), "/w", "login").to_json()["requeue"] is None


CHAIN = """0 start 1000 n[1-2]
0 signal 1040
0 end 1052 0
0 requeue 1052
1 start 1070 n[1-2]
1 end 1100 0
"""


def test_the_jobs_record_of_its_allocations_counts_time_trained_and_queued() -> None:
    chain = Chain.parse(CHAIN + "garbage line\n1 end\n")
    assert [(a.count, a.start, a.end, a.status, a.requeued) for a in chain.allocations] == \
        [(0, 1000, 1052, 0, True), (1, 1070, 1100, 0, False)]
    assert chain.allocations[0].signalled == 1040 and chain.requeues == 1 and not chain.spent
    assert chain.trained_seconds() == 52 + 30
    assert chain.queued_seconds(990) == 10 + 18  # before the first, and between the two
    assert chain.queued_seconds(None) is None
    running = Chain.parse("0 start 1000 n1\n")
    assert running.trained_seconds(now=1010) == 10 and running.trained_seconds() == 0


def test_end_lines_of_a_chain_completed_and_of_one_whose_requeues_were_spent() -> None:
    done = job_status("12", "COMPLETED", exit_code="0:0", cpus=4)
    chain = Chain.parse(CHAIN)
    fields = {"allocations": 2, "requeues": 1, "trained_seconds": 82.0, "queued_seconds": 28.0}
    assert requeue_chain.end_line(done, fields, chain, 3, "-") == \
        "job 12 COMPLETED (exit 0:0) after 2 allocation(s) (1 requeue(s)): 82 s trained, 28 s queued"
    spent_chain = Chain.parse(CHAIN + "1 signal 1095\n1 spent 1100\n")
    stopped = job_status("12", "FAILED", exit_code="75:0", cpus=4)
    assert requeue_chain.spent(stopped, spent_chain) and not requeue_chain.spent(stopped, chain)
    line = requeue_chain.end_line(stopped, fields, spent_chain, 1, "epoch 2, 40 steps in (x.pt)")
    assert line == ("job 12 TIMEOUT after 1 requeue(s) (--max-requeues 1): the time limit came again and no requeue "
                    "was left; saved: epoch 2, 40 steps in (x.pt); 82 s trained, 28 s queued over 2 allocation(s) "
                    "(1 requeue(s)) (Slurm: FAILED, exit 75:0)")


def test_requeues_are_told_once_each() -> None:
    watch = requeue_chain.RequeueWatch("12", 3)
    assert watch.requeued_line(job_status("12", "RUNNING")) is None
    assert watch.requeued_line(job_status("12", "PENDING", restarts=1)) == \
        "job 12 requeued (1/3) at the time limit"
    assert watch.requeued_line(job_status("12", "RUNNING", restarts=1)) is None
    assert watch.allocation(job_status("12", "RUNNING", restarts=1)) == " (allocation 2)"


def test_an_allocation_cut_at_its_limit_counts_slurms_own_times() -> None:
    # The killed batch shell wrote no end: Slurm's StartTime/EndTime of the last allocation count.
    cut = Chain.parse("0 start 1000 n[1-2]\n0 signal 1040\n")
    timeout = job_status("12", "TIMEOUT", exit_code="0:15", start_time=999.0, end_time=1066.0, cpus=4)
    assert requeue_chain.allocation_spans(cut, timeout, None) == ([(999.0, 1066.0)], "requeue/chain and scontrol")
    # An earlier allocation too, where accounting answers (sacct --duplicates): its records win.
    two = Chain.parse(CHAIN)
    assert requeue_chain.allocation_spans(two, timeout, [(998.0, 1053.0), (1069.0, 1101.0)]) == \
        ([(998.0, 1053.0), (1069.0, 1101.0)], "sacct")
    # Without accounting, the job's own record of the allocations that ended by themselves.
    assert requeue_chain.allocation_spans(two, timeout, None) == ([(1000, 1052), (1070, 1100)], "requeue/chain")
    # No record by the job at all (its first line never written): Slurm's times.
    assert requeue_chain.allocation_spans(Chain(), timeout, None) == ([(999.0, 1066.0)], "scontrol")


def test_a_timeout_after_an_unheeded_signal_names_it_and_the_handler_to_add() -> None:
    chain = Chain.parse("0 start 1000 n[1-2]\n0 signal 1040\n")
    status = job_status("12", "TIMEOUT", exit_code="0:15", start_time=1000.0, end_time=1066.0, cpus=4)
    told = requeue_chain.unheeded_signal(status, chain)
    assert told.startswith("SIGUSR1 came at ") and "(26 s before the end) and no snapshot followed" in told
    assert "Add a SIGUSR1 handler" in told and "examples/slurm_requeue.py" in told
    fields = {"allocations": 1, "requeues": 0, "trained_seconds": 66.0, "queued_seconds": 1.0}
    line = requeue_chain.end_line(status, fields, chain, 1, "-")
    assert line.startswith("job 12 TIMEOUT (exit 0:15) after 1 allocation(s) (0 requeue(s)): 66 s trained, "
                           "1 s queued; SIGUSR1 came at ")
    assert "Add a SIGUSR1" not in requeue_chain.unheeded_signal(status, chain, user_command=False)
    # Not said when the signal never came, or the script stopped after it (the shell wrote the end).
    assert requeue_chain.unheeded_signal(status, Chain.parse("0 start 1000 n1\n")) == ""
    assert requeue_chain.unheeded_signal(status, Chain.parse("0 start 1000 n1\n0 signal 1040\n0 end 1050 0\n")) == ""


def test_a_signal_as_the_command_finished_is_told_with_how_to_ask_for_a_requeue() -> None:
    chain = Chain.parse("0 start 1000 n1\n0 signal 1040\n0 end 1041 0\n0 finished 1041\n")
    done = job_status("12", "COMPLETED", exit_code="0:0", cpus=2)
    fields = {"allocations": 1, "requeues": 0, "trained_seconds": 41.0, "queued_seconds": 1.0}
    line = requeue_chain.end_line(done, fields, chain, 1, "-")
    assert line.startswith("job 12 COMPLETED (exit 0:0) after 1 allocation(s) (0 requeue(s)): 41 s trained, 1 s "
                           "queued; SIGUSR1 came at ")
    assert "taken as finished" in line and "$DDPCTL_REQUEUE_MARK" in line and "examples/slurm_requeue.py" in line
    # A plain completion (no signal) says nothing of it.
    assert "SIGUSR1" not in requeue_chain.end_line(done, fields, Chain.parse("0 start 1000 n1\n0 end 1041 0\n"), 1,
                                                     "-")


@pytest.mark.parametrize(("source", "warned"), [
    ("import time\nwhile True:\n    time.sleep(1)\n", "has no SIGUSR1 handler in sight"),
    ("import signal\nsignal.signal(signal.SIGUSR1, lambda *_: None)\n", "never names DDPCTL_REQUEUE_MARK"),
    ("from signal import SIGUSR1, signal\nsignal(SIGUSR1, print)\n", "never names DDPCTL_REQUEUE_MARK"),
    ("import os, signal\nsignal.signal(signal.SIGUSR1, print)\nopen(os.environ['DDPCTL_REQUEUE_MARK'], 'a')\n", ""),
])
def test_the_dry_run_warns_when_requeue_meets_a_script_with_no_handler_or_mark_in_sight(
        tmp_path: Path, source: str, warned: str) -> None:
    (tmp_path / "train.py").write_text(source)
    spec = RunSpec(run_id="r", python="python3", user_command=("python", "train.py"))
    warning = requeue.handler_warning(spec, SlurmRequest(time="10", max_requeues=1), tmp_path)
    assert (warned in warning) if warned else warning == ""
    if warned:
        assert warning.startswith("--requeue: train.py ") and "examples/slurm_requeue.py" in warning
    assert requeue.handler_warning(spec, SlurmRequest(), tmp_path) == ""  # no --requeue: nothing to say


class AccountingAnswer:
    """A login connection whose only command, sacct, answers as a cluster with accounting (or without) does."""

    def __init__(self, result: CommandResult) -> None:
        self.result = result
        self.asked: list[list[str]] = []

    def run(self, argv: list[str], **_: object) -> CommandResult:
        self.asked.append(argv)
        return self.result


def test_each_allocation_of_a_requeued_job_is_read_from_accounting_where_the_cluster_keeps_it() -> None:
    scheduler = SlurmScheduler(SlurmRequest(), "login")
    kept = AccountingAnswer(CommandResult(0, "2026-11-25T15:29:27|2026-11-25T15:30:37\n"
                                             "2026-11-25T15:31:00|2026-11-25T15:32:01\nUnknown|Unknown\n", ""))
    spans = scheduler.allocation_spans(kept, "12")  # type: ignore[arg-type]
    assert kept.asked == [["sacct", "-j", "12", "-X", "-D", "-n", "-P", "-o", "Start,End"]]
    assert spans is not None and [round(end - start) for start, end in spans] == [70, 61]
    # No accounting (the test cluster's case): sacct refuses, and the job's own record counts.
    refused = AccountingAnswer(CommandResult(1, "", "sacct: error: Slurm accounting storage is disabled"))
    assert scheduler.allocation_spans(refused, "12") is None  # type: ignore[arg-type]
