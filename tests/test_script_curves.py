"""A `-- CMD` script's own logs among what came back (launcher/results/script_curves.py): TensorBoard event files
written here with SummaryWriter and read back with EventAccumulator, W&B offline folders, the outcome's line."""

from __future__ import annotations

import json
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

from launcher.results.script_curves import event_files, read_scalars, script_logs_line, wandb_offline_runs


def test_a_scripts_event_files_and_wandb_runs_are_found_where_they_came_back(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "r"
    writer = SummaryWriter(str(run / "nodes" / "0" / "workdir" / "tb"))
    for step, (loss, when) in enumerate([(0.9, 1000.0), (0.5, 1004.0), (0.25, 1010.0)], start=1):
        writer.add_scalar("train/loss", loss, step, walltime=when)
    writer.add_scalar("val/acc", 0.75, 3, walltime=1009.0)
    writer.close()
    offline = run / "out" / "wandb" / "offline-run-20261128_050000-abc"
    offline.mkdir(parents=True)
    (run / "out" / "offline-run-not-wandb").mkdir()  # only wandb/ folders are W&B's
    [found] = event_files(run)
    assert found.parent == run / "nodes" / "0" / "workdir" / "tb"
    assert wandb_offline_runs(run) == [offline]
    scalars = read_scalars([found])
    assert scalars is not None and (scalars.first_time, scalars.last_time) == (1000.0, 1010.0)
    assert [(tag, round(value, 6)) for tag, value in scalars.last_values] == [("train/loss", 0.25), ("val/acc", 0.75)]
    line = script_logs_line(run)
    assert line == (f"your script's own logs: TensorBoard event files in {found.parent} (`tensorboard --logdir DIR` "
                    f"shows them); W&B offline runs {offline} (`wandb sync DIR` uploads them)")


def test_a_local_runs_files_are_found_in_its_working_directory(tmp_path: Path) -> None:
    workdir, run = tmp_path / "project", tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    writer = SummaryWriter(str(workdir / "logs"))
    writer.add_scalar("loss", 1.0, 1)
    writer.close()
    [written] = list((workdir / "logs").iterdir())
    (workdir / "old").mkdir()
    (workdir / "old" / written.name).write_bytes(written.read_bytes())  # there before the run: not listed
    listed = [{"path": f"logs/{written.name}", "size": 1, "sha256": "x"}]
    (run / "workdir.json").write_text(json.dumps({"workdir": str(workdir), "files": listed}))
    assert event_files(run) == [written]
    assert read_scalars([]) is None and script_logs_line(tmp_path / "nothing") is None
