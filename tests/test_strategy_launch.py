"""Strategies from the launcher's side (issue 14): refusals before anything starts, the layout torchrun and the
trainer get, a real sweep of strategies x process counts and its report, and the "not comparable" flag.
The refusals call ddpctl's main() in this process (one line, its exit status, nothing written); the sweep runs it
as a process."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from matplotlib.image import imread

from launcher.results.plots import DPI, FIG_SIZE_IN
from launcher.results.report import render_markdown, row_cells
from launcher.results.run_figures import build_report, load_run, scaling_table
from launcher.spec.run_spec import RunSpec
from launcher.spec.strategies import STRATEGIES
from launcher.spec.torchrun import NodeRole, torchrun_argv
from tests import cli_runner
from tests.cli_in_process import ddpctl_in_process

REPO = Path(__file__).resolve().parent.parent
TINY = ["--epochs", "1", "--synthetic-train-size", "256", "--synthetic-test-size", "64"]
# GPUs hidden, so that the GPU refusals hold on a GPU machine too.
NO_GPU_ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO)}


def ddpctl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return cli_runner.ddpctl(*args, cwd=REPO, env={"CUDA_VISIBLE_DEVICES": ""}, timeout=timeout)


TWO_HOSTS = ["--host", "node0.invalid", "--host", "node1.invalid"]
REFUSALS = {
    "dp without GPUs": (["up", "--strategy", "dp"], "--devices cpu"),
    "mp without GPUs": (["up", "--strategy", "mp"], "--devices cpu,cpu"),
    "ddp-mp without GPUs": (["up", "--strategy", "ddp-mp", "--gpus", "2"], "--devices cpu,cpu"),
    "ddp-mp with an odd count": (["up", "--strategy", "ddp-mp", "--gpus", "3", "--devices", "cpu,cpu"], "even"),
    "hogwild across nodes": (["up", "--strategy", "hogwild", *TWO_HOSTS], "one node"),
    "spawn across nodes": (["up", "--strategy", "spawn", *TWO_HOSTS], "one node"),
    "local-sgd with one process": (["up", "--strategy", "local-sgd", "--gpus", "1"], "at least 2"),
    "--devices with ddp": (["up", "--devices", "cpu"], "--devices is for"),
    "--average-every with hogwild": (["up", "--strategy", "hogwild", "--average-every", "2"], "--average-every is for"),
    "a bad --average-every": (["up", "--strategy", "local-sgd", "--average-every", "often"], "'epoch' or 'end'"),
    "mp with one device": (["up", "--strategy", "mp", "--devices", "cpu"], "two devices"),
    "-- CMD with spawn": (["up", "--strategy", "spawn", "--", "echo", "hi"], "drop --strategy spawn"),
    "an unknown strategy": (["up", "--strategy", "pipeline"], "choose one of"),
    "sweep: dp without GPUs": (["sweep", "--strategy", "ddp,dp", "--gpus", "1,2"], "--devices cpu"),
    "sweep: --average-every for none": (["sweep", "--strategy", "ddp,hogwild", "--gpus", "1", "--average-every",
                                         "end"], "none of which"),
    "sweep: an unknown strategy": (["sweep", "--strategy", "ddp,pipeline", "--gpus", "1"], "choose from"),
    "sweep: only local-sgd on one process": (["sweep", "--strategy", "local-sgd", "--gpus", "1"], "at least 2"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_strategy_that_cannot_run_is_refused_in_one_line_with_nothing_written(case: str, tmp_path: Path) -> None:
    args, says = REFUSALS[case]
    runs = tmp_path / "runs"
    proc = ddpctl_in_process(args[0], "--runs-dir", str(runs), *args[1:], cwd=REPO, env={"CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], proc.stderr
    assert not runs.exists() and not list(tmp_path.iterdir())


def argv_of(**fields: Any) -> list[str]:
    spec = RunSpec(run_id="r", **fields)
    return torchrun_argv(spec, NodeRole(node_rank=0, out_dir="/o", log_dir="/l"))


def option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


@pytest.mark.parametrize(("strategy", "extra", "workers", "processes"), [
    ("ddp", {}, "3", None),
    ("local-sgd", {"average_every": "end"}, "3", None),
    ("spawn", {}, "1", "3"),
    ("hogwild", {}, "1", "3"),
    ("dp", {"devices": "cpu"}, "1", None),
    ("mp", {"devices": "cpu,cpu"}, "1", None),
])
def test_torchrun_runs_each_strategy_with_the_layout_of_its_contract(strategy: str, extra: dict[str, Any],
                                                                     workers: str, processes: str | None) -> None:
    argv = argv_of(strategy=strategy, nproc_per_node=3, threads_per_process=2, **extra)
    assert option(argv, "--nproc-per-node") == workers
    assert option(argv, "--processes") == processes
    assert option(argv, "--strategy") == (None if strategy == "ddp" else strategy)
    assert option(argv, "--threads-per-process") == "2"
    assert option(argv, "--devices") == extra.get("devices")
    assert option(argv, "--average-every") == extra.get("average_every")


def test_ddp_mp_gets_one_process_per_two_gpus_and_dp_the_first_gpus() -> None:
    assert option(argv_of(strategy="ddp-mp", nproc_per_node=4), "--nproc-per-node") == "2"
    dp = argv_of(strategy="dp", nproc_per_node=2)
    assert (option(dp, "--nproc-per-node"), option(dp, "--devices")) == ("1", "cuda:0,cuda:1")
    assert option(argv_of(precision="bf16"), "--precision") == "bf16"
    assert "--precision" not in argv_of() and "--strategy" not in argv_of()


def test_run_json_records_the_resolved_layout_and_reads_back() -> None:
    spec = RunSpec(run_id="r", strategy="hogwild", nproc_per_node=4, threads_per_process=1)
    data = spec.to_json()
    assert (data["strategy"], data["torchrun_workers_per_node"], data["trainer_processes"],
            data["processes_per_node"]) == ("hogwild", 1, 4, 4)
    assert RunSpec.from_json(json.loads(json.dumps(data))) == spec
    assert RunSpec.from_json({"run_id": "old"}).strategy == "ddp"  # a run.json from before strategies


def test_every_strategy_has_a_row_in_the_strategies_guide() -> None:
    guide = (REPO / "docs" / "guides" / "strategies.md").read_text()
    assert all(f"\n| `{name}` " in guide for name in STRATEGIES)


@pytest.mark.timeout(400)
def test_sweep_of_strategies_by_process_count_writes_the_comparison_table_and_plots(tmp_path: Path) -> None:
    """Two strategies other than ddp, each by process count: ddp's own sweep (1 and 2 processes, its report and
    plots) is tests/test_sweep.py's test_local_sweep_on_synthetic_data_runs_both_layouts_and_reports."""
    proc = ddpctl("sweep", "--strategy", "local-sgd,hogwild", "--gpus", "1,2", *TINY, "--threads-per-process",
                  "1", "--runs-dir", str(tmp_path), "--no-progress", timeout=380)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "left out local-sgd-1x1" in proc.stdout
    (sweep_dir,) = tmp_path.glob("sweep-*")
    manifest = json.loads((sweep_dir / "sweep.json").read_text())
    ran = [(e["strategy"], e["world_size"]) for e in manifest["entries"]]
    assert ran == [("local-sgd", 2), ("hogwild", 1), ("hogwild", 2)]
    for entry in manifest["entries"]:
        summary = json.loads((sweep_dir / entry["run_dir"] / "summary.json").read_text())
        assert (summary["strategy"], summary["world_size"], summary["threads_per_process"]) == (
            entry["strategy"], entry["world_size"], 1)
        run = json.loads((sweep_dir / entry["run_dir"] / "run.json").read_text())
        assert run["spec"]["strategy"] == entry["strategy"]
    report = json.loads((sweep_dir / "report.json").read_text())
    assert sorted((r["strategy"], r["world_size"]) for r in report["rows"]) == sorted(ran)
    markdown = (sweep_dir / "report.md").read_text()
    for strategy, world_size in ran:
        assert any(line.startswith(f"| 1x{world_size} | {strategy} | {world_size} | 1 |")
                   for line in markdown.splitlines()), (strategy, world_size)
    for png in ("scaling.png", "accuracy.png"):
        height, width = imread(sweep_dir / png).shape[:2]
        assert (width, height) == (FIG_SIZE_IN[0] * DPI, FIG_SIZE_IN[1] * DPI)


def write_run(root: Path, name: str, *, strategy: str, world_size: int, seconds: float,
              load: tuple[float, float] = (0.1, 0.2), cores: int = 4) -> Path:
    """A finished one-epoch run in the contract's format, with the machine load the trainer records."""
    path = root / name
    path.mkdir(parents=True)
    record = {"epoch": 1, "epochs": 1, "seconds": seconds, "val_seconds": 0.1, "samples": 640, "steps": 20,
              "train_loss": 1.0, "train_acc": 0.8, "val_loss": 1.1, "val_acc": 0.75, "world_size": world_size,
              "restart_count": 0, "time": time.time()}
    (path / "timing.jsonl").write_text(json.dumps(record) + "\n")
    summary = {"world_size": world_size, "nnodes": 1, "model": "mnist-cnn-small", "dataset": "synthetic",
               "batch_size": 32, "lr": 0.1, "strategy": strategy, "processes_per_node": world_size,
               "threads_per_process": 1, "cores": cores, "load_start": [load[0], 0.0, 0.0],
               "load_end": [load[1], 0.0, 0.0]}
    (path / "summary.json").write_text(json.dumps(summary))
    return path


def test_super_linear_and_busy_runs_are_flagged_not_comparable(tmp_path: Path) -> None:
    paths = [
        write_run(tmp_path, "ddp1", strategy="ddp", world_size=1, seconds=10.0),
        write_run(tmp_path, "ddp2", strategy="ddp", world_size=2, seconds=6.0),  # 83%: a result
        write_run(tmp_path, "hog1", strategy="hogwild", world_size=1, seconds=10.0),
        write_run(tmp_path, "hog2", strategy="hogwild", world_size=2, seconds=1.9),  # 263%: super-linear
        write_run(tmp_path, "ddp4", strategy="ddp", world_size=4, seconds=3.0, load=(3.5, 4.0)),  # busy
    ]
    rows = {(r.strategy, r.world_size): r for r in scaling_table([load_run(p) for p in paths])}
    assert rows[("ddp", 2)].not_comparable == "" and rows[("hogwild", 1)].not_comparable == ""
    assert "super-linear" in rows[("hogwild", 2)].not_comparable
    assert "busy" in rows[("ddp", 4)].not_comparable
    assert rows[("hogwild", 2)].speedup == pytest.approx(10.0 / 1.9)  # against hogwild's own 1-process run
    cells = row_cells(rows[("hogwild", 2)])
    assert "5.26x" not in cells and "263%" not in cells and "n/c" in cells
    assert "0.83" in " ".join(row_cells(rows[("ddp", 2)])) or "1.67x" in row_cells(rows[("ddp", 2)])
    markdown = render_markdown(list(rows.values()))
    assert "## Not comparable" in markdown and "super-linear: 263% efficiency" in markdown


def test_write_up_5_figures_stand_beside_their_strategies(tmp_path: Path) -> None:
    paths = [write_run(tmp_path, "ddp1", strategy="ddp", world_size=1, seconds=10.0),
             write_run(tmp_path, "sgd2", strategy="local-sgd", world_size=2, seconds=6.0),
             write_run(tmp_path, "hog1", strategy="hogwild", world_size=1, seconds=5.0)]
    report = build_report(paths, preset="mnist-cpu")
    markdown = render_markdown(report.rows, report.reference, None, report.preset, report.preset_dataset,
                               report.extra_references)
    assert "## Beside the reference (local-sgd)" in markdown and "## Beside the reference (hogwild)" in markdown
    local_sgd = markdown.split("## Beside the reference (local-sgd)")[1].split("## Beside")[0]
    assert "| 1 | 20 | - | 0.17 | 12.2 |" in local_sgd  # ddp's 1-process run beside the write-up's 12.2 min
    hogwild = markdown.split("## Beside the reference (hogwild)")[1]
    assert "| 1 | 20 | - | 0.08 | 6.3 |" in hogwild
