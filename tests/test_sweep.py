"""Sweeps: layouts, lr scaling, the manifest and resume (with a run executor that writes contract-format run
directories), then real local sweeps through `ddpctl sweep` with torchrun, gloo and the trainer, and one sweep on
the test bed's two hosts with up's launch options."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from launcher.cli import app as cli
from launcher.errors import DdpctlError, SpecError
from launcher.results.run_figures import load_run, scaling_table
from launcher.results.rundir import RunDir, read_jsonl
from launcher.results.sweep import (
    Layout,
    SweepError,
    _sweep_lock,
    load_manifest,
    new_sweep,
    parse_counts,
    plan_layouts,
    run_sweep,
    scaled_lr,
)
from launcher.spec.run_spec import RunSpec
from tests.cli_runner import ddpctl_argv, ddpctl_env
from tests.test_report import median, write_run
from tests.testbed_fixtures import lent, needs_testbed, run_ddpctl

REPO = Path(__file__).resolve().parent.parent
TINY = ["--epochs", "1", "--synthetic-train-size", "256", "--synthetic-test-size", "64"]


class WritingExecutor:
    """Runs nothing: writes each spec's run directory as a finished run would, and remembers the calls."""

    def __init__(self, fail_on: int | None = None, interrupt_on: int | None = None, epochs_done: int | None = None):
        self.calls: list[RunSpec] = []
        self.manifests_seen: list[dict[str, Any]] = []
        self.fail_on, self.interrupt_on, self.epochs_done = fail_on, interrupt_on, epochs_done

    def __call__(self, spec: RunSpec, runs_dir: Path) -> Path:
        self.calls.append(spec)
        self.manifests_seen.append(load_manifest(runs_dir))
        if len(self.calls) == self.interrupt_on:
            raise KeyboardInterrupt
        if len(self.calls) == self.fail_on:
            raise DdpctlError("pull failed on 1 of 2 host(s):\n  h1: timed out")
        write_run(runs_dir, spec.run_id, spec.world_size, epochs=self.epochs_done or spec.epochs,
                  nnodes=spec.nnodes)
        return runs_dir / spec.run_id


def base_spec(**fields: Any) -> RunSpec:
    return RunSpec(run_id="base", epochs=2, lr=0.02, **fields)


@pytest.mark.parametrize("text", ["0,2", "", " ", "1,,2", "a,2", "1.5", "-1", "2,"])
def test_bad_counts_are_one_line_errors(text: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_counts(text, "--gpus")
    assert "\n" not in str(info.value) and "--gpus" in str(info.value)


def test_layouts_are_ordered_by_world_size_once_each() -> None:
    assert parse_counts(" 4, 1,2", "--gpus") == [4, 1, 2]
    layouts = plan_layouts([4, 1, 2, 2], [2, 1])
    assert [(lay.nnodes, lay.nproc_per_node) for lay in layouts] == [(1, 1), (1, 2), (2, 1), (1, 4), (2, 2), (2, 4)]


def test_lr_scaling_modes() -> None:
    assert scaled_lr(0.01, 4, 1, "none") == 0.01
    assert scaled_lr(0.01, 4, 1, "linear") == pytest.approx(0.04)
    assert scaled_lr(0.01, 8, 2, "sqrt") == pytest.approx(0.02)
    with pytest.raises(SpecError, match="--scale-lr"):
        scaled_lr(0.01, 2, 1, "cubic")


def test_sweep_runs_each_layout_and_writes_the_manifest_after_each_step(tmp_path: Path) -> None:
    sweep_dir = new_sweep(base_spec(), plan_layouts([1, 2, 4], [1]), tmp_path, "linear", "mnist")
    execute = WritingExecutor()
    manifest = run_sweep(sweep_dir, execute)
    assert [s.world_size for s in execute.calls] == [1, 2, 4]
    assert [s.lr for s in execute.calls] == pytest.approx([0.02, 0.04, 0.08])
    assert all(s.run_id.startswith(sweep_dir.name) for s in execute.calls)
    # What was on disk when the second run started: the first done, the second running.
    seen = [e["status"] for e in execute.manifests_seen[1]["entries"]]
    assert seen == ["done", "running", "pending"]
    assert manifest == load_manifest(sweep_dir)
    assert [e["status"] for e in manifest["entries"]] == ["done"] * 3
    assert [(sweep_dir / e["run_dir"]).is_dir() for e in manifest["entries"]] == [True] * 3
    assert manifest["preset"] == "mnist" and manifest["base_spec"]["lr"] == 0.02


def test_an_interrupted_sweep_resumes_with_the_entry_it_stopped_at(tmp_path: Path) -> None:
    sweep_dir = new_sweep(base_spec(), plan_layouts([1, 2, 4], [1]), tmp_path)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(sweep_dir, WritingExecutor(interrupt_on=2))
    entries = load_manifest(sweep_dir)["entries"]
    assert [e["status"] for e in entries] == ["done", "interrupted", "pending"]
    again = WritingExecutor()
    manifest = run_sweep(sweep_dir, again)
    # The first layout is not run again; the interrupted one restarts from scratch in a new run directory.
    assert [s.world_size for s in again.calls] == [2, 4]
    assert again.calls[0].run_id == f"{sweep_dir.name}-1x2-r2"
    assert [e["status"] for e in manifest["entries"]] == ["done"] * 3


def test_a_failed_run_stops_the_sweep_with_a_one_line_error_saying_how_to_continue(tmp_path: Path) -> None:
    sweep_dir = new_sweep(base_spec(), plan_layouts([1, 2], [1]), tmp_path)
    with pytest.raises(SweepError) as info:
        run_sweep(sweep_dir, WritingExecutor(fail_on=1))
    message = str(info.value)
    assert "\n" not in message and "layout 1x1" in message and f"--resume {sweep_dir}" in message
    assert "host(s): h1: timed out;" in message
    assert [e["status"] for e in load_manifest(sweep_dir)["entries"]] == ["failed", "pending"]


def test_a_run_that_ends_before_its_last_epoch_is_a_failure(tmp_path: Path) -> None:
    sweep_dir = new_sweep(base_spec(), plan_layouts([1], [1]), tmp_path)
    with pytest.raises(SweepError, match="ended before its last epoch"):
        run_sweep(sweep_dir, WritingExecutor(epochs_done=1))


def test_a_run_that_finished_before_the_manifest_said_so_is_not_run_again(tmp_path: Path) -> None:
    sweep_dir = new_sweep(base_spec(), plan_layouts([1, 2], [1]), tmp_path)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(sweep_dir, WritingExecutor(interrupt_on=2))
    manifest = load_manifest(sweep_dir)
    write_run(sweep_dir, manifest["entries"][1]["run_dir"], 2, epochs=2)  # it had finished after all
    again = WritingExecutor()
    assert [e["status"] for e in run_sweep(sweep_dir, again)["entries"]] == ["done", "done"]
    assert again.calls == []


def test_one_sweep_is_driven_by_one_process_at_a_time(tmp_path: Path) -> None:
    sweep_dir = new_sweep(base_spec(), plan_layouts([1], [1]), tmp_path)
    with _sweep_lock(sweep_dir), pytest.raises(SweepError, match="being run by another ddpctl"):
        run_sweep(sweep_dir, WritingExecutor())


def test_an_invalid_entry_fails_before_any_run(tmp_path: Path) -> None:
    with pytest.raises(SpecError):
        new_sweep(base_spec(), [Layout(1, 0)], tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("args", "expected"), [
    (["--gpus", "0,2"], "'0' is not a positive integer"),
    (["--gpus", ""], "is not a list"),
    (["--gpus", "1,x"], "'x' is not a positive integer"),
    (["--gpus", "1", "--nodes", "2"], "needs at least 2 --host"),
    (["--gpus", "1", "--scale-lr", "cubic"], "--scale-lr 'cubic'"),
    (["--gpus", "1", "--preset", "imagenet"], "unknown preset 'imagenet'"),
    (["--resume", "RUNS"], "is not a sweep directory"),
    (["--resume", "RUNS", "--gpus", "2"], "leave out --gpus"),
    # the local run's own checks, made before the sweep directory exists
    (["--gpus", "1", "--dataset", "mnist", "--data-dir", "/nonexistent"], "data set mnist not found"),
    (["--gpus", "1", "--python", "/nonexistent/python"], "--python '/nonexistent/python': there is no file"),
    (["--gpus", "1", "--python", ""], "--python '' names no interpreter"),
    (["--gpus", "1", "--lr", "inf"], "--lr must be positive and finite, got inf"),
    (["--gpus", "1", "--host", "a", "--host", "a"], "--host 'a' is given twice"),
    (["--gpus", "1", "--host", "a", "--connect-timeout", "0"], "--connect-timeout 0: give a positive number"),
    (["--gpus", "1", "--host", "a", "--runtime", "docker", "--image", "Bad Tag"],
     "--image 'Bad Tag' is not a valid image reference"),
])  # fmt: skip
def test_sweep_command_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            args: list[str], expected: str) -> None:
    args = [str(tmp_path) if a == "RUNS" else a for a in args]
    with pytest.raises(SystemExit) as info:
        cli.main(["sweep", *args, "--runs-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert info.value.code == 1 and err.count("\n") == 1 and expected in err, err
    assert not (tmp_path / "runs").exists()


def test_a_local_sweep_wider_than_this_machines_gpus_writes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import launcher.execute.this_machine.run

    monkeypatch.setattr(launcher.execute.this_machine.run, "local_gpu_count", lambda: 2)
    with pytest.raises(SystemExit) as info:
        cli.main(["sweep", "--gpus", "1,2,4", "--runs-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert info.value.code == 1 and err == ("error: --gpus 4 asks for more GPUs than this machine has (2); use "
                                            "--gpus 2 or less\n")
    assert not (tmp_path / "runs").exists()


def test_a_sweep_runs_dir_that_is_a_file_is_named_as_such(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(SystemExit) as info:
        cli.main(["sweep", "--gpus", "1", "--runs-dir", str(afile)])
    err = capsys.readouterr().err
    assert info.value.code == 1 and err.startswith(f"error: --runs-dir {afile} is a file, not a directory")


def ddpctl(*args: str, **kwargs: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(ddpctl_argv(*args), cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=ddpctl_env(), **kwargs)


def sweep_dir_in(runs: Path) -> Path:
    (sweep_dir,) = runs.glob("sweep-*")
    return sweep_dir


def check_report(sweep_dir: Path) -> None:
    """The report's table equals the figures computed here from each run's timing records; plots open."""
    from matplotlib.image import imread

    manifest = load_manifest(sweep_dir)
    records = {e["world_size"]: read_jsonl(sweep_dir / e["run_dir"] / "timing.jsonl") for e in manifest["entries"]}
    report = json.loads((sweep_dir / "report.json").read_text())
    totals = {ws: sum(r["seconds"] for r in recs) for ws, recs in records.items()}
    assert [row["world_size"] for row in report["rows"]] == sorted(records)
    for row in report["rows"]:
        recs = records[row["world_size"]]
        assert row["epoch_seconds"] == pytest.approx(median([r["seconds"] for r in recs]))
        assert row["train_seconds"] == pytest.approx(totals[row["world_size"]])
        assert row["speedup"] == pytest.approx(totals[1] / totals[row["world_size"]])
        assert row["samples_per_s"] == pytest.approx(sum(r["samples"] for r in recs) / totals[row["world_size"]])
        assert (row["train_acc"], row["val_acc"]) == (recs[-1]["train_acc"], recs[-1]["val_acc"])
        assert row["steps_per_epoch"] == math.ceil(math.ceil(256 / row["world_size"]) / 32)
        assert row["dataset"] == "synthetic"
    for png in report["plots"]:
        assert imread(sweep_dir / png).shape[:2] == (500, 800)
    markdown = (sweep_dir / "report.md").read_text()
    assert "![scaling](scaling.png)" in markdown
    for entry in manifest["entries"]:
        assert f"| {entry['nnodes']}x{entry['nproc_per_node']} |" in markdown
    assert scaling_table([load_run(sweep_dir / e["run_dir"]) for e in manifest["entries"]])[1].world_size == 2


def stop_orphaned_torchruns(runs: Path) -> None:
    """torchrun runs in a session of its own; if ddpctl itself had to be killed, stop what it started."""
    for run_json in runs.glob("sweep-*/*/run.json"):
        pid = json.loads(run_json.read_text()).get("local_pid")
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


@pytest.mark.timeout(300)
def test_local_sweep_on_synthetic_data_runs_both_layouts_and_reports(tmp_path: Path) -> None:
    proc = ddpctl("sweep", "--gpus", "1,2", "--preset", "mnist-cpu", "--strategy", "ddp", "--dataset", "synthetic",
                  *TINY, "--runs-dir", str(tmp_path), "--no-progress")
    out, err = proc.communicate(timeout=280)
    assert proc.returncode == 0, out + err
    sweep_dir = sweep_dir_in(tmp_path)
    manifest = load_manifest(sweep_dir)
    assert [(e["world_size"], e["status"]) for e in manifest["entries"]] == [(1, "done"), (2, "done")]
    assert manifest["report"] == "report.md" and "report.md" in out
    check_report(sweep_dir)
    assert "reference: MNIST on CPU" in (sweep_dir / "report.md").read_text()


@pytest.mark.timeout(300)
def test_local_sweep_interrupted_after_its_first_run_resumes_with_the_second(tmp_path: Path) -> None:
    # More epochs than the first test so that the second run is still training when Ctrl-C comes (it comes at
    # once once that run's progress.json is there, written at its first step).
    epochs = 10
    proc = ddpctl("sweep", "--gpus", "1,2", *TINY[:1], str(epochs), *TINY[2:], "--runs-dir", str(tmp_path),
                  "--no-progress", start_new_session=True)
    try:
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline and proc.poll() is None:
            dirs = list(tmp_path.glob("sweep-*/sweep.json"))
            entries = json.loads(dirs[0].read_text())["entries"] if dirs else []
            if len(entries) == 2 and entries[1]["status"] == "running" and (
                    dirs[0].parent / entries[1]["run_dir"] / "progress.json").exists():
                break
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGINT)  # Ctrl-C reaches ddpctl alone; it stops torchrun itself
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            stop_orphaned_torchruns(tmp_path)
    assert proc.returncode == 130 and err.strip().endswith(f"--resume {sweep_dir_in(tmp_path)}`"), out + err
    sweep_dir = sweep_dir_in(tmp_path)
    entries = load_manifest(sweep_dir)["entries"]
    assert [e["status"] for e in entries] == ["done", "interrupted"], entries
    first = sweep_dir / entries[0]["run_dir"]
    first_timing = (first / "timing.jsonl").read_text()

    resumed = ddpctl("sweep", "--resume", str(sweep_dir), "--no-progress")
    out, err = resumed.communicate(timeout=280)
    assert resumed.returncode == 0, out + err
    entries = load_manifest(sweep_dir)["entries"]
    assert [(e["status"], e["attempts"]) for e in entries] == [("done", 1), ("done", 2)]
    assert entries[1]["run_dir"].endswith("-1x2-r2") and "layout 1x1" not in out
    assert (first / "timing.jsonl").read_text() == first_timing  # the first run was not touched
    assert len(read_jsonl(sweep_dir / entries[1]["run_dir"] / "timing.jsonl")) == epochs
    check_report(sweep_dir)


@pytest.fixture(scope="module")
def bed(two_hosts: Any) -> Iterator[Any]:
    yield from lent(two_hosts)


@dataclass
class HostSweep:
    runs: Path
    result: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def host_sweep(bed: Any, tmp_path_factory: pytest.TempPathFactory) -> HostSweep:
    """One sweep over the bed's two hosts (--nodes 1,2, one process each) with up's launch options: read by the
    report test and the launch-options test. OMP_NUM_THREADS sets the trainer's threads per process, which
    summary.json records: proof the value got there."""
    runs = tmp_path_factory.mktemp("host-sweep") / "runs"
    hosts = [arg for h in bed.hosts for arg in ("--host", h.spec)]
    result = run_ddpctl(bed, "sweep", "--gpus", "1", "--nodes", "1,2", *hosts, *TINY, "--env", "OMP_NUM_THREADS=3",
                        "--stall-timeout", "120", "--rdzv-port", "29517", "--runs-dir", str(runs), "--no-progress",
                        timeout=450)
    return HostSweep(runs, result)


@needs_testbed
@pytest.mark.testbed
@pytest.mark.timeout(500)
def test_sweep_over_ssh_hosts_reports_the_runs_pulled_from_them(host_sweep: HostSweep, tmp_path: Path) -> None:
    out, err = host_sweep.result.stdout, host_sweep.result.stderr
    assert host_sweep.result.returncode == 0, out + err
    sweep_dir = sweep_dir_in(host_sweep.runs)
    entries = load_manifest(sweep_dir)["entries"]
    assert [(e["nnodes"], e["status"]) for e in entries] == [(1, "done"), (2, "done")]
    for entry in entries:
        assert (sweep_dir / entry["run_dir"] / "nodes" / "0").is_dir()  # pulled from the host
    check_report(sweep_dir)
    # `ddpctl report` over the pulled run directories reads them the same way.
    report = ddpctl("report", *(str(sweep_dir / e["run_dir"]) for e in entries), "--json",
                    "--out", str(tmp_path / "report"))
    out, err = report.communicate(timeout=120)
    assert report.returncode == 0, err
    assert [row["layout"] for row in json.loads(out)["rows"]] == ["1x1", "2x1"]


def planned_lines(run: RunDir) -> list[str]:
    """What each node was told to run (its trainer argv), with the run id taken out."""
    (event,) = [e for e in run.events() if e["event"] == "planned"]
    return [line.replace(run.run_id, "RUN") for line in event["nodes"]]


@needs_testbed
@pytest.mark.timeout(500)
def test_sweep_with_env_stall_timeout_and_rdzv_port_reaches_every_run(host_sweep: HostSweep) -> None:
    result = host_sweep.result
    assert result.returncode == 0, result.stdout + result.stderr
    (sweep_dir,) = [p for p in host_sweep.runs.iterdir() if p.name.startswith("sweep-")]
    manifest = json.loads((sweep_dir / "sweep.json").read_text())
    assert "OMP_NUM_THREADS=3" not in json.dumps(manifest) and manifest["launch"]["env_names"] == ["OMP_NUM_THREADS"]
    entries = manifest["entries"]
    assert [(e["nnodes"], e["status"]) for e in entries] == [(1, "done"), (2, "done")]
    for entry in entries:
        run = RunDir.open(sweep_dir / entry["run_dir"])
        assert run.spec().rdzv_port == 29517 and run.spec().withheld_env == ("OMP_NUM_THREADS",)
        assert all(":29517" in line or "--standalone" in line for line in planned_lines(run))
        summaries = list(run.path.glob("nodes/*/out/summary.json"))
        assert summaries and all(json.loads(s.read_text())["threads_per_process"] == 3 for s in summaries)
        assert run.typed_record().options["stall_timeout"] == 120.0  # type: ignore[index]
        assert not [e for e in read_jsonl(run.path / "events.jsonl") if "stall" in e["event"]]
