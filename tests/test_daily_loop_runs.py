"""A researcher's first hour, run for real on this machine: the built-in trainer's epoch lines (in the plain
output, `logs`, `logs --rank 0`), its TensorBoard event files read by TensorBoard's own EventAccumulator and its
CSV; and a plain DDP script, written as the PyTorch DDP tutorial writes it and knowing nothing of ddpctl, run on 1
and 2 processes and given a scaling report."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.cli_runner import ddpctl

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent
SMALL = ["--synthetic-train-size", "512", "--synthetic-test-size", "128"]

# multigpu_torchrun.py of the PyTorch DDP tutorial, on CPU (gloo), with a small data set; `--tensorboard DIR`:
# rank 0 logs its loss per step with SummaryWriter, as many scripts do.
TUTORIAL_SCRIPT = textwrap.dedent('''
    import gc
    import os
    import sys

    import torch
    import torch.nn.functional as F
    from torch.distributed import destroy_process_group, init_process_group
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, Dataset
    from torch.utils.data.distributed import DistributedSampler


    class MyTrainDataset(Dataset):
        def __init__(self, size):
            generator = torch.Generator().manual_seed(0)
            self.data = [(torch.rand(20, generator=generator), torch.rand(1, generator=generator))
                         for _ in range(size)]

        def __len__(self):
            return len(self.data)

        def __getitem__(self, index):
            return self.data[index]


    class Trainer:
        def __init__(self, model, train_data, optimizer, writer):
            self.gpu_id = int(os.environ["LOCAL_RANK"])
            self.model = DDP(model)
            self.train_data = train_data
            self.optimizer = optimizer
            self.writer = writer
            self.steps = 0

        def _run_batch(self, source, targets):
            self.optimizer.zero_grad()
            loss = F.mse_loss(self.model(source), targets)
            loss.backward()
            self.optimizer.step()
            self.steps += 1
            if self.writer is not None:
                self.writer.add_scalar("train/loss", loss.item(), self.steps)
                self.last_loss = loss.item()

        def _run_epoch(self, epoch):
            b_sz = len(next(iter(self.train_data))[0])
            print(f"[GPU{self.gpu_id}] Epoch {epoch} | Batchsize: {b_sz} | Steps: {len(self.train_data)}")
            self.train_data.sampler.set_epoch(epoch)
            for source, targets in self.train_data:
                self._run_batch(source, targets)

        def train(self, max_epochs):
            for epoch in range(max_epochs):
                self._run_epoch(epoch)


    def main(total_epochs, batch_size, logdir):
        init_process_group(backend="gloo")
        dataset = MyTrainDataset(512)
        model = torch.nn.Linear(20, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        data = DataLoader(dataset, batch_size=batch_size, pin_memory=False, shuffle=False,
                          sampler=DistributedSampler(dataset))
        writer = None
        if logdir and int(os.environ["RANK"]) == 0:
            from torch.utils.tensorboard import SummaryWriter
            writer = SummaryWriter(logdir)
        trainer = Trainer(model, data, optimizer, writer)
        trainer.train(total_epochs)
        if writer is not None:
            writer.close()
            print(f"last loss {trainer.last_loss!r}")
        del trainer, model
        gc.collect()  # torch 2.13, gloo: a DDP model alive as the interpreter ends aborts it (SIGABRT)
        destroy_process_group()


    if __name__ == "__main__":
        logdir = sys.argv[sys.argv.index("--tensorboard") + 1] if "--tensorboard" in sys.argv else None
        main(2, 32, logdir)
''')


def test_a_2_epoch_run_tells_each_epoch_and_writes_curves_tensorboard_reads(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    up = ddpctl("up", "--gpus", "1", "--epochs", "2", "--runs-dir", str(runs), "--progress", "plain", *SMALL,
                cwd=tmp_path)
    assert up.returncode == 0, up.stderr
    [run] = list(runs.iterdir())
    lines = up.stderr.splitlines()
    assert f"run {run.name} (its directory: {run})" in lines[0], "the log names its run first"
    assert "world measured" not in up.stderr
    timing = [json.loads(line) for line in (run / "timing.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in timing] == [1, 2]
    for record in timing:  # rank 0's line, as the plain output shows it
        line = (f"rank 0: epoch {record['epoch']}/2  train loss {record['train_loss']:.4f}  "
                f"acc {100 * record['train_acc']:.2f}%  val loss {record['val_loss']:.4f}  "
                f"acc {100 * record['val_acc']:.2f}%  {record['samples_per_s']:,.0f} samples/s")
        assert any(line in shown for shown in lines), (line, up.stderr)

    # TensorBoard's own reader: the loss at each epoch's last step, the same numbers as timing.jsonl.
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    assert {"loss/train", "loss/val", "accuracy/train", "accuracy/val", "learning_rate", "samples_per_s",
            "step_time_s"} <= set(events.Tags()["scalars"])
    loss = events.Scalars("loss/train")
    assert len(loss) == 2
    steps = timing[0]["steps"]
    assert [e.step for e in loss] == [steps, 2 * steps]
    assert [e.value for e in loss] == pytest.approx([r["train_loss"] for r in timing], rel=1e-6)
    assert [e.value for e in events.Scalars("learning_rate")] == pytest.approx([0.01, 0.01])
    with (run / "scalars.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [float(r["val_acc"]) for r in rows] == [r["val_acc"] for r in timing]
    assert [float(r["step_seconds"]) for r in rows] == pytest.approx([r["seconds"] / steps for r in timing])

    logs = ddpctl("logs", str(run), cwd=tmp_path)
    assert logs.returncode == 0 and "epoch 2/2  train loss" in logs.stdout, logs.stdout + logs.stderr
    rank0 = ddpctl("logs", str(run), "--rank", "0", cwd=tmp_path)
    assert [line.split("  ")[0] for line in rank0.stdout.splitlines() if line.startswith("epoch ")] == \
        ["epoch 1/2", "epoch 2/2"]
    status = ddpctl("status", str(run), cwd=tmp_path)
    assert status.returncode == 0 and f"run {run.name}" in status.stdout and "finished" in status.stdout, \
        status.stderr  # the table on stdout: `ddpctl status > file` keeps it


def _script_run(tmp_path: Path, gpus: int, *script_args: str) -> tuple[Path, subprocess.CompletedProcess[str]]:
    runs = tmp_path / "runs"
    before = set(runs.iterdir()) if runs.is_dir() else set()
    up = ddpctl("up", "--gpus", str(gpus), "--runs-dir", str(runs), "--progress", "plain", "--", "python",
                "multigpu_torchrun.py", *script_args, cwd=tmp_path)
    assert up.returncode == 0, up.stderr
    [run] = set(runs.iterdir()) - before
    return run, up


def test_a_scripts_own_tensorboard_scalars_come_back_are_named_and_reach_its_report_row(tmp_path: Path) -> None:
    (tmp_path / "multigpu_torchrun.py").write_text(TUTORIAL_SCRIPT)
    run, up = _script_run(tmp_path, 2, "--tensorboard", "tb")
    assert f"your script's own logs: TensorBoard event files in {tmp_path / 'tb'}" in up.stderr
    rank0 = next((run / "logs").rglob("attempt_0/0/stdout.log")).read_text()
    logged = float(next(line for line in rank0.splitlines() if line.startswith("last loss ")).split()[-1])
    report = ddpctl("report", str(run), "--json", "--out", str(tmp_path / "report"), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    [row] = json.loads(report.stdout)["rows"]
    assert row["world_size"] == 2
    assert [tag for tag, _ in row["script_scalars"]] == ["train/loss"]
    assert row["script_scalars"][0][1] == pytest.approx(logged, rel=1e-6)
    assert 0 < row["first_step_s"] < row["last_step_s"]
    assert row["train_seconds"] == pytest.approx(row["last_step_s"] - row["first_step_s"])


def test_a_scripts_traceback_does_not_show_ddpctls_join_hook(tmp_path: Path) -> None:
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text((REPO / "launcher" / "runtimes" / "join_hook.py").read_text())
    (tmp_path / "bad.py").write_text("import torch.distributed as dist\n"
                                     "dist.init_process_group('gloo', init_method='env://', rank=0, world_size=1)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    failed = subprocess.run([sys.executable, "bad.py"], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                            env={**env, "PYTHONPATH": str(hook), "DDPCTL_JOIN_DIR": str(tmp_path / "joined")})
    assert failed.returncode == 1 and 'File "' + str(tmp_path / "bad.py") + '", line 2' in failed.stderr
    assert "in init_process_group" in failed.stderr, failed.stderr  # torch's own frames stay
    assert "sitecustomize" not in failed.stderr and "hook" not in failed.stderr, failed.stderr


def test_a_sweep_of_a_plain_ddp_script_ends_in_its_scaling_report_and_each_of_its_runs_gets_a_row(
        tmp_path: Path) -> None:
    (tmp_path / "multigpu_torchrun.py").write_text(TUTORIAL_SCRIPT)
    runs = tmp_path / "runs"
    swept = ddpctl("sweep", "--gpus", "1,2", "--runs-dir", str(runs), "--progress", "plain", "--", "python",
                   "multigpu_torchrun.py", cwd=tmp_path)
    assert swept.returncode == 0, swept.stderr
    [sweep] = [p for p in runs.iterdir() if (p / "sweep.json").is_file()]
    rows = json.loads((sweep / "report.json").read_text())["rows"]
    assert [(r["layout"], r["world_size"]) for r in rows] == [("1x1", 1), ("1x2", 2)]
    assert all(r["wall_seconds"] > 0 and r["model"] == "multigpu_torchrun.py" for r in rows)
    assert "1x2" in swept.stdout and "report: " in swept.stdout
    one, two = [sweep / e["run_dir"] for e in json.loads((sweep / "sweep.json").read_text())["entries"]]
    again = ddpctl("up", "--from", str(two), "--dry-run", cwd=tmp_path)  # one layout again: the same script
    assert again.returncode == 0 and "--no-python" in again.stdout and " multigpu_torchrun.py" in again.stdout, \
        again.stdout + again.stderr
    report_gives_a_scaling_row_for_a_plain_ddp_script_on_1_and_2_processes(tmp_path, one, two)


def report_gives_a_scaling_row_for_a_plain_ddp_script_on_1_and_2_processes(tmp_path: Path, one: Path,
                                                                           two: Path) -> None:
    """`ddpctl report` over a plain script's runs at 1 and 2 processes (the sweep's own two): the processes that
    joined the group, measured; no step seen, so the wall time is the training time."""
    rank1 = next((two / "logs").rglob("attempt_0/1/stdout.log")).read_text()
    assert "[GPU1] Epoch 1 | Batchsize: 32 | Steps: 8" in rank1  # the script's own lines, nothing of ddpctl's
    report = ddpctl("report", str(one), str(two), "--json", "--out", str(tmp_path / "report"), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    rows = json.loads(report.stdout)["rows"]
    assert [r["world_size"] for r in rows] == [1, 2]
    summaries = [json.loads((run / "summary.json").read_text()) for run in (one, two)]
    assert [s["processes"] for s in summaries] == [1, 2]  # measured: the processes that joined the group
    for row, summary in zip(rows, summaries, strict=True):
        assert row["wall_seconds"] == summary["wall_seconds"] > 0
        assert row["train_seconds"] == summary["wall_seconds"], "no step seen: the time is the wall time"
        assert row["first_step_s"] is None and row["epoch_seconds"] is None and row["samples_per_s"] is None
    assert rows[1]["speedup"] == pytest.approx(rows[0]["wall_seconds"] / rows[1]["wall_seconds"])
    table = ddpctl("report", str(one), str(two), "--out", str(tmp_path / "report"), cwd=tmp_path)
    assert table.returncode == 0 and "1x1" in table.stdout and "1x2" in table.stdout, table.stderr
    assert "no step seen" in table.stdout
    assert "## Scripts without epoch records" in (tmp_path / "report" / "report.md").read_text()
