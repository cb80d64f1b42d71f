"""Scaling reports over run directories written here in the contract's format (docs/contracts.md), with every
expected figure computed in the test from the records it wrote."""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path
from typing import Any

import pytest
import typer
from matplotlib.image import imread
from typer.testing import CliRunner

from launcher.cli import app as cli
from launcher.cli.report_sweep import register
from launcher.errors import RunDirError
from launcher.results.plots import DPI, FIG_SIZE_IN
from launcher.results.report import render_markdown, write_report
from launcher.results.run_figures import build_report, load_run, scaling_table
from launcher.spec.presets import get_preset


def timing_records(world_size: int, epochs: int, *, rng: random.Random, train_size: int = 640,
                   batch: int = 32) -> list[dict[str, Any]]:
    """Plausible per-epoch records of one run: times fall with the world size, accuracy rises per epoch."""
    steps = math.ceil(math.ceil(train_size / world_size) / batch)
    records = []
    for epoch in range(1, epochs + 1):
        seconds = rng.uniform(8.0, 12.0) / world_size
        samples = steps * batch * world_size
        records.append({
            "epoch": epoch, "epochs": epochs, "seconds": seconds, "val_seconds": 0.3, "samples": samples,
            "samples_per_s": samples / seconds, "steps": steps, "train_loss": 2.0 / epoch,
            "train_acc": min(0.99, 0.5 + 0.1 * epoch - 0.01 * world_size), "val_loss": 2.1 / epoch,
            "val_acc": min(0.98, 0.45 + 0.1 * epoch - 0.02 * world_size), "world_size": world_size,
            "restart_count": 0, "time": time.time() + epoch,
        })  # fmt: skip
    return records


def write_run(root: Path, name: str, world_size: int, *, epochs: int = 3, nnodes: int = 1, seed: int = 0,
              created: float | None = None, run_json: bool = True, place: str = "", cost: float | None = None,
              dataset: str = "synthetic") -> list[dict[str, Any]]:
    """A finished run directory in the contract's format; returns its timing records."""
    path = root / name
    files = path / place if place else path
    files.mkdir(parents=True)
    records = timing_records(world_size, epochs, rng=random.Random(seed))
    (files / "timing.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = {"wall_seconds": 99.0, "train_seconds": sum(r["seconds"] for r in records), "epochs": epochs,
               "final_train_acc": records[-1]["train_acc"], "final_val_acc": records[-1]["val_acc"],
               "world_size": world_size, "nnodes": nnodes, "model": "mnist-cnn", "dataset": dataset,
               "batch_size": 32, "lr": 0.01, "seed": 0}
    (files / "summary.json").write_text(json.dumps(summary))
    if run_json:
        spec = {"run_id": name, "model": "mnist-cnn", "dataset": dataset, "epochs": epochs, "batch_size": 32,
                "lr": 0.01, "nnodes": nnodes, "nproc_per_node": world_size // nnodes}
        record: dict[str, Any] = {"run_id": name, "spec": spec, "created": created or time.time()}
        if cost is not None:
            record["cost_usd"] = cost
        (path / "run.json").write_text(json.dumps(record))
    return records


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def test_table_figures_equal_those_computed_from_the_timing_records(tmp_path: Path) -> None:
    written = {ws: write_run(tmp_path, f"run-ws{ws}", ws, epochs=4, seed=ws) for ws in (4, 1, 2)}
    rows = scaling_table([load_run(tmp_path / f"run-ws{ws}") for ws in (4, 1, 2)])
    assert [r.world_size for r in rows] == [1, 2, 4]
    base_total = sum(r["seconds"] for r in written[1])
    for row in rows:
        records = written[row.world_size]
        total = sum(r["seconds"] for r in records)
        assert row.epoch_seconds == pytest.approx(median([r["seconds"] for r in records]))
        assert row.train_seconds == pytest.approx(total)
        assert row.speedup == pytest.approx(base_total / total)
        assert row.efficiency == pytest.approx(base_total / total / row.world_size)
        assert row.samples_per_s == pytest.approx(sum(r["samples"] for r in records) / total)
        assert row.train_acc == records[-1]["train_acc"]
        assert row.val_acc == records[-1]["val_acc"]
        assert row.steps_per_epoch == records[-1]["steps"]
        assert row.global_batch == 32 * row.world_size
        assert row.cost_usd is None
    assert rows[0].speedup == 1.0


def test_compose_run_without_run_json_takes_its_world_size_from_the_records(tmp_path: Path) -> None:
    records = write_run(tmp_path, "compose", 2, run_json=False)
    run = load_run(tmp_path / "compose")
    assert (run.world_size, run.model, run.dataset, run.run_id) == (2, "mnist-cnn", "synthetic", "compose")
    assert scaling_table([run])[0].train_seconds == pytest.approx(sum(r["seconds"] for r in records))


@pytest.mark.parametrize("rank0_node", [0, 1])
def test_run_pulled_from_hosts_reads_the_files_of_rank_0s_node(tmp_path: Path, rank0_node: int) -> None:
    """Without the top-level copies, the files are those of the node that held global rank 0 (the one with a
    summary), which torchrun may have put on any node."""
    records = write_run(tmp_path, "pulled", 4, nnodes=2, place=f"nodes/{rank0_node}/out")
    # The other node may hold a stale timing file of an earlier attempt; it must not be taken for the run's.
    other = tmp_path / "pulled" / "nodes" / str(1 - rank0_node) / "out"
    other.mkdir(parents=True)
    (other / "timing.jsonl").write_text(json.dumps({**records[0], "seconds": 1000.0}) + "\n")
    row = scaling_table([load_run(tmp_path / "pulled")])[0]
    assert (row.world_size, row.nnodes, row.layout) == (4, 2, "2x2")
    assert row.train_seconds == pytest.approx(sum(r["seconds"] for r in records))


def test_a_directory_that_is_not_a_run_is_a_one_line_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunDirError, match="empty is not a run directory") as info:
        load_run(tmp_path / "empty")
    assert "\n" not in str(info.value)
    with pytest.raises(RunDirError, match="missing is not a directory"):
        load_run(tmp_path / "missing")
    write_run(tmp_path, "started", 1)
    (tmp_path / "started" / "timing.jsonl").write_text("")
    with pytest.raises(RunDirError, match="no finished epoch"):
        load_run(tmp_path / "started")


def test_report_cli_error_is_one_line_with_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes").mkdir()
    with pytest.raises(SystemExit) as info:
        cli.main(["report", str(tmp_path / "notes"), "--out", str(tmp_path / "out")])
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "notes is not a run directory" in err
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_newest_run_of_a_layout_is_kept_and_the_older_named(tmp_path: Path) -> None:
    write_run(tmp_path, "old", 2, seed=1, created=1000.0)
    newer = write_run(tmp_path, "new", 2, seed=2, created=2000.0)
    write_run(tmp_path, "base", 1, seed=3, created=1500.0)
    rows = scaling_table([load_run(tmp_path / n) for n in ("new", "base", "old")])
    assert [(r.run_id, r.superseded) for r in rows] == [("base", ()), ("new", ("old",))]
    assert rows[1].train_seconds == pytest.approx(sum(r["seconds"] for r in newer))
    assert "`old`" in render_markdown(rows)


def test_a_bf16_run_is_a_row_of_its_own_named_by_its_precision(tmp_path: Path) -> None:
    """--precision bf16 (summary.json's precision) is not the same experiment as fp32: it neither replaces the
    fp32 run of its layout nor serves as its speed-up base, and the table says which row is which."""
    write_run(tmp_path, "fp32", 1, seed=1, created=1000.0)
    write_run(tmp_path, "bf16", 1, seed=2, created=2000.0)
    summary_path = tmp_path / "bf16" / "summary.json"
    summary_path.write_text(json.dumps({**json.loads(summary_path.read_text()), "precision": "bf16"}))
    rows = scaling_table([load_run(tmp_path / n) for n in ("fp32", "bf16")])
    assert [(r.run_id, r.strategy_label, r.superseded) for r in rows] == [("fp32", "ddp", ()),
                                                                         ("bf16", "ddp (bf16)", ())]
    assert "ddp (bf16)" in render_markdown(rows)


def test_an_epoch_recorded_twice_after_a_restart_counts_once(tmp_path: Path) -> None:
    records = write_run(tmp_path, "restarted", 2, epochs=2)
    again = {**records[1], "seconds": 50.0, "restart_count": 1}
    with open(tmp_path / "restarted" / "timing.jsonl", "a") as f:
        f.write(json.dumps(again) + "\n")
    row = scaling_table([load_run(tmp_path / "restarted")])[0]
    assert (row.epochs, row.train_seconds) == (2, pytest.approx(records[0]["seconds"] + 50.0))


def test_cost_is_shown_where_recorded_and_a_dash_elsewhere(tmp_path: Path) -> None:
    write_run(tmp_path, "local", 1)
    write_run(tmp_path, "rented", 2, cost=0.4213)
    markdown = render_markdown(scaling_table([load_run(tmp_path / "local"), load_run(tmp_path / "rented")]))
    table = [line for line in markdown.splitlines() if line.startswith("| 1x")]
    assert table[0].endswith("| - |") and table[1].endswith("| 0.42 |")


def test_markdown_report_with_reference_explanation_and_plots(tmp_path: Path) -> None:
    for ws in (1, 2, 4):
        write_run(tmp_path / "runs", f"ws{ws}", ws, seed=ws)
    report = build_report([tmp_path / "runs" / f"ws{ws}" for ws in (1, 2, 4)], preset="mnist")
    files = write_report(report, tmp_path / "out")
    assert sorted(p.name for p in files) == ["accuracy.png", "curves.png", "report.json", "report.md", "scaling.png"]
    markdown = (tmp_path / "out" / "report.md").read_text()
    reference = get_preset("mnist").reference
    assert f"reference: {reference.source}" in markdown
    comparison = [line for line in markdown.splitlines() if line.startswith("| 4 |")][0]
    assert "| 469 |" in comparison and "| 6.0 |" in comparison  # the write-up's steps and accuracy drop
    assert "data set synthetic, not the preset's mnist" in markdown
    assert "Why accuracy drops" in markdown and "--scale-lr linear" in markdown
    for png in ("scaling.png", "accuracy.png", "curves.png"):
        assert f"]({png})" in markdown
        height, width = imread(tmp_path / "out" / png).shape[:2]
        assert (width, height) == (FIG_SIZE_IN[0] * DPI, FIG_SIZE_IN[1] * DPI) == (800, 500)


def test_report_command_json_carries_the_same_figures(tmp_path: Path) -> None:
    written = {ws: write_run(tmp_path, f"ws{ws}", ws, seed=ws) for ws in (1, 2)}
    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(app, ["report", str(tmp_path / "ws1"), str(tmp_path / "ws2"), "--json",
                                      "--out", str(tmp_path / "out"), "--preset", "cifar10-resnet18"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    totals = {ws: sum(r["seconds"] for r in recs) for ws, recs in written.items()}
    assert [r["world_size"] for r in data["rows"]] == [1, 2]
    assert data["rows"][1]["speedup"] == pytest.approx(totals[1] / totals[2])
    assert data["rows"][1]["val_acc"] == written[2][-1]["val_acc"]
    assert data["reference"]["time_ratio"]["2"] == 0.55
    assert sorted(data["plots"]) == ["accuracy.png", "curves.png", "scaling.png"]
    assert (tmp_path / "out" / "report.md").is_file()


def test_report_command_prints_a_table(tmp_path: Path) -> None:
    write_run(tmp_path, "ws1", 1)
    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(app, ["report", str(tmp_path / "ws1"), "--out", str(tmp_path / "out")],
                                env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "Scaling" in result.output and "1x1" in result.output and "report.md" in result.output


@pytest.mark.parametrize("under_a_file", [False, True])
def test_report_out_that_cannot_be_a_directory_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           under_a_file: bool) -> None:
    write_run(tmp_path, "ws1", 1)
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    out = afile / "report" if under_a_file else afile
    with pytest.raises(SystemExit) as info:
        cli.main(["report", str(tmp_path / "ws1"), "--out", str(out)])
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: cannot write the report"), err
    if under_a_file:
        assert f"({out}: Not a directory); give a directory you can write to with --out" in err
    else:
        assert f"{afile} is a file, not a directory; give a directory with --out" in err
    assert afile.read_text() == "keep me"


def test_report_out_is_created_with_its_parents(tmp_path: Path) -> None:
    write_run(tmp_path, "ws1", 1)
    out = tmp_path / "new" / "nested"
    cli.main(["report", str(tmp_path / "ws1"), "--out", str(out)])  # returns: exit status 0
    assert {"report.md", "report.json", "scaling.png"} <= {p.name for p in out.iterdir()}


def test_a_script_runs_row_shows_no_trainer_default_it_never_used(tmp_path: Path) -> None:
    """A `-- python train.py` run's spec carries our trainer's defaults (batch 32, lr 0.01); its script read none
    of them, so its report row must not claim them: unknown unless the script reported them."""
    from launcher.results.run_figures import load_run
    from launcher.results.rundir import RunDir
    from launcher.spec.run_spec import RunSpec

    spec = RunSpec(run_id="script-run", user_command=("python", "train.py"))
    run_dir = RunDir.create(tmp_path, spec, {"nodes": []})
    (run_dir.path / "timing.jsonl").write_text(json.dumps({"epoch": 1, "seconds": 2.0, "samples": 640,
                                                           "world_size": 2}) + "\n")
    figures = load_run(run_dir.path)
    assert spec.batch_size and spec.lr  # the defaults are there in the spec...
    assert figures.batch_size is None and figures.lr is None  # ...and not in the row
    assert figures.threads_per_process is None
    assert figures.world_size == 2  # what the script's processes measured


def test_a_script_run_whose_world_nobody_measured_is_left_out_not_given_the_planned_size(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--nodes 2 --gpus 2` asked for 4 processes; a script that spawned its own may have run 8, or 2 worlds of
    2. With nothing measured, the report must not place the run at world size 4."""
    from launcher.results.rundir import RunDir
    from launcher.spec.run_spec import RunSpec

    spec = RunSpec(run_id="spawned", user_command=("python", "spawn.py"), nproc_per_node=2)
    run_dir = RunDir.create(tmp_path / "runs", spec, {"nodes": []})
    (run_dir.path / "timing.jsonl").write_text(json.dumps({"epoch": 1, "seconds": 2.0, "samples": 640}) + "\n")
    with pytest.raises(SystemExit) as info:
        cli.main(["report", str(run_dir.path), "--out", str(tmp_path / "alone")])
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "world size was not measured" in err, err
    assert not (tmp_path / "alone").exists()

    write_run(tmp_path / "runs", "ws1", 1)
    cli.main(["report", str(run_dir.path), str(tmp_path / "runs" / "ws1"), "--out", str(tmp_path / "both")])
    err = capsys.readouterr().err
    assert f"warning: run {run_dir.path}: its world size was not measured" in err and "left out" in err
    report = json.loads((tmp_path / "both" / "report.json").read_text())
    assert [row["world_size"] for row in report["rows"]] == [1]  # ws1 alone; no row at the planned size 2


def test_the_whole_table_goes_into_a_pipe_not_80_columns_of_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """`ddpctl report ... | less` (stdout not a terminal, COLUMNS=80 as a pipe's reader may have): every column
    whole, none cut to an ellipsis, although the table is wider than 80 columns."""
    write_run(tmp_path, "ws1", 1, cost=0.5)
    write_run(tmp_path, "ws2", 2)
    for name in ("summary.json", "run.json"):  # another lr and strategy: the table shows both columns
        path = tmp_path / "ws2" / name
        data = json.loads(path.read_text())
        (data["spec"] if name == "run.json" else data)["lr"] = 0.02
        if name == "run.json":
            data["spec"]["strategy"] = "local-sgd"
        path.write_text(json.dumps(data))
    monkeypatch.setenv("COLUMNS", "80")
    cli.main(["report", str(tmp_path / "ws1"), str(tmp_path / "ws2"), "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith(("1x1", "1x2"))]
    assert rows[0][:5] == ["1x1", "ddp", "1", "32", "0.01"] and rows[0][-1] == "0.50"
    assert rows[1][:5] == ["1x2", "local-sgd", "2", "64", "0.02"]
    assert "…" not in out and max(len(line) for line in out.splitlines()) > 80
