"""`--strategy hogwild`: one model in shared memory, N worker processes on one node, each training on its own
shard with its own optimizer and updating the shared parameters without locks (write-up 5, after
pytorch/examples' mnist_hogwild). Runs on the CPU, as write-up 5 does.

This command's own process coordinates: it starts the workers once (torch.multiprocessing, spawn), tells them
when to run each epoch, gathers their sums, validates the shared model and is the one writer of the records and
snapshots. A worker that dies fails the run; rerun the command to resume after the last snapshot. Each worker's
momentum buffer (with --momentum) starts again from zero on resume: a snapshot holds the shared model only.
"""

from __future__ import annotations

import io
import math
import multiprocessing.queues
import os
import queue
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from trainer.data import DataSplits
from trainer.determinism import seed_rng
from trainer.distributed import cpu_model
from trainer.errors import SnapshotError, TrainerError
from trainer.files import atomic_write_bytes
from trainer.records import ProgressReporter, build_summary, versions, write_summary
from trainer.run_log import RunLog
from trainer.sharding import samples_per_rank, shard_indices
from trainer.snapshot import newest_valid, save_snapshot, snapshot_path
from trainer.strategies.common import initial_model, read_data, set_threads, strategy_summary
from trainer.strategies.options import StrategyOptions, process_count, threads_per_process
from trainer.trainer import EVAL_BATCH_SIZE, SNAPSHOT_FORMAT, TrainConfig

WORKER_POLL_S = 0.5  # how often the coordinator checks that its workers are alive while it waits


class HogwildTrainer:
    """The coordinator: runs epochs through the workers, validates, records and snapshots the shared model."""

    def __init__(self, config: TrainConfig, data: DataSplits, model: nn.Module, options: StrategyOptions,
                 processes: int, threads: int) -> None:  # fmt: skip
        self.config, self.options, self.processes, self.threads = config, options, processes, threads
        self.data = data.channels_last()
        # Channels-last for the CPU convolutions, as the Trainer does; share_memory puts every parameter in
        # shared memory, where each worker's optimizer updates it in place.
        self.model = model.to(memory_format=torch.channels_last).share_memory()  # type: ignore[call-overload]
        self.snapshot_dir = config.snapshot_dir or config.out_dir / "snapshots"
        self.per_worker = samples_per_rank(len(data.train_y), processes)
        self.steps_per_epoch = math.ceil(self.per_worker / config.batch_size)
        self.epochs_done = 0
        self.records: list[dict[str, Any]] = []
        self.wall_start = time.time()
        self.timing = RunLog(config.out_dir, lambda: config.lr)  # trainer/run_log.py: epoch lines, CSV, TensorBoard
        self.progress = self.timing.progress(config.epochs, self.steps_per_epoch)
        self.commands: list[Any] = []
        self.results: Any = None
        self.workers: list[Any] = []

    # --- one epoch, run by the workers -----------------------------------------------------------------

    def _run_epoch(self, epoch: int) -> tuple[float, float, float, int]:
        """Let every worker train `epoch` on its shard; (seconds, mean loss, accuracy, samples) over all."""
        start = time.perf_counter()
        for commands in self.commands:
            commands.put(epoch)
        sums = torch.zeros(3, dtype=torch.float64)
        for _ in self.workers:
            sums += torch.tensor(self._next_result(), dtype=torch.float64)
        seconds = time.perf_counter() - start
        loss_sum, correct, count = sums.tolist()
        return seconds, loss_sum / count, correct / count, int(count)

    def _next_result(self) -> tuple[float, float, float]:
        """The next worker's (loss sum, correct, count); a worker that died fails the run."""
        while True:
            try:
                return self.results.get(timeout=WORKER_POLL_S)
            except queue.Empty:
                dead = [(rank, w.exitcode) for rank, w in enumerate(self.workers) if w.exitcode not in (None, 0)]
                if dead:
                    rank, code = dead[0]
                    raise TrainerError(
                        f"hogwild worker {rank} died (exit code {code}); "
                        "rerun the same command to resume after the last snapshot"
                    ) from None

    @torch.no_grad()
    def _evaluate(self) -> tuple[float, float]:
        """Loss and accuracy of the shared model on the whole test split."""
        self.model.eval()
        loss_sum, correct = 0.0, 0
        test_x, test_y = self.data.test_x, self.data.test_y
        for first in range(0, len(test_y), EVAL_BATCH_SIZE):
            output = self.model(test_x[first : first + EVAL_BATCH_SIZE])
            labels = test_y[first : first + EVAL_BATCH_SIZE]
            loss_sum += float(F.nll_loss(output, labels, reduction="sum"))
            correct += int((output.argmax(dim=1) == labels).sum())
        return loss_sum / len(test_y), correct / len(test_y)

    # --- snapshots (this process is their one writer) --------------------------------------------------

    def _save_snapshot(self) -> None:
        state = {
            "format": SNAPSHOT_FORMAT, "strategy": "hogwild", "epochs_done": self.epochs_done,
            "identity": self.config.identity(), "world_size": self.processes, "model": self.model.state_dict(),
            "records": self.records, "wall_start": self.wall_start,
        }  # fmt: skip
        save_snapshot(self.snapshot_dir, self.epochs_done, state, self.config.keep_snapshots)

    def _load_snapshot(self) -> bool:
        """Resume from the newest valid snapshot (its weights copied into the shared model); False if none."""
        found = newest_valid(self.snapshot_dir, _warn)
        if found is None:
            return False
        epoch, state = found
        if state.get("strategy") != "hogwild" or state.get("identity") != self.config.identity():
            raise SnapshotError(f"{snapshot_path(self.snapshot_dir, epoch)} belongs to another run "
                                f"({state.get('strategy', 'not hogwild')}, {state.get('identity')}); "
                                "use another --snapshot-dir or remove it")  # fmt: skip
        self.model.load_state_dict(state["model"])
        self.records = list(state["records"])
        self.wall_start = float(state["wall_start"])
        self.epochs_done = int(state["epochs_done"])
        _warn(f"resuming after epoch {epoch} from {snapshot_path(self.snapshot_dir, epoch)}")
        return True

    # --- the whole run ---------------------------------------------------------------------------------

    def train(self) -> dict[str, Any]:
        """Start the workers, run the remaining epochs, write the records; returns the summary."""
        cfg = self.config
        cfg.out_dir.mkdir(parents=True, exist_ok=True)
        self._load_snapshot()
        self.timing.rewrite(self.records)
        if self.epochs_done < cfg.epochs:
            self._start_workers()
        try:
            for epoch in range(self.epochs_done + 1, cfg.epochs + 1):
                seconds, train_loss, train_acc, samples = self._run_epoch(epoch)
                self.progress.write(epoch=epoch, step=self.steps_per_epoch, samples_per_s=samples / seconds,
                                    state="validating")  # fmt: skip
                val_start = time.perf_counter()
                val_loss, val_acc = self._evaluate()
                record = {
                    "epoch": epoch, "epochs": cfg.epochs, "seconds": seconds,
                    "val_seconds": time.perf_counter() - val_start, "samples": samples,
                    "samples_per_s": samples / seconds, "steps": self.steps_per_epoch, "train_loss": train_loss,
                    "train_acc": train_acc, "val_loss": val_loss, "val_acc": val_acc,
                    "world_size": self.processes, "restart_count": 0, "time": time.time(),
                }  # fmt: skip
                self.records.append(record)
                self.timing.append(record)
                self.epochs_done = epoch
                if epoch % cfg.save_every == 0 or epoch == cfg.epochs:
                    self._save_snapshot()
        finally:
            self._stop_workers()
        return self._finish()

    def _finish(self) -> dict[str, Any]:
        cfg = self.config
        extra = {
            "world_size": self.processes, "nnodes": 1, "model": cfg.model, "dataset": cfg.dataset,
            "batch_size": cfg.batch_size, "lr": cfg.lr, "momentum": cfg.momentum, "seed": cfg.seed,
            "versions": versions(), "devices": [f"cpu: {cpu_model()}"] * self.processes, "first_step_time": None,
            **strategy_summary(self.options, self.processes, self.threads),
        }  # fmt: skip
        summary = build_summary(self.records, wall_start=self.wall_start, restarts=0, extra=extra)
        buffer = _state_bytes(self.model.state_dict())
        atomic_write_bytes(cfg.out_dir / "final_model.pt", buffer)
        write_summary(cfg.out_dir / "summary.json", summary)
        last = self.records[-1] if self.records else {"samples_per_s": 0.0}
        self.progress.write(epoch=self.epochs_done, step=self.steps_per_epoch,
                            samples_per_s=last["samples_per_s"], state="done")  # fmt: skip
        return summary

    def _start_workers(self) -> None:
        context = mp.get_context("spawn")  # fork after torch's thread pools have run is not safe
        self.results = context.Queue()
        self.commands = [context.Queue() for _ in range(self.processes)]
        for rank in range(self.processes):
            worker = context.Process(
                target=_worker, daemon=True,  # stopped with this process, whatever stops it
                args=(rank, self.processes, self.model, self.data, self.config, self.threads,
                      self.commands[rank], self.results),
            )  # fmt: skip
            worker.start()
            self.workers.append(worker)
        for _ in self.workers:  # started (torch imported, shared tensors mapped): epoch 1's time excludes it
            self._next_result()

    def _stop_workers(self) -> None:
        for commands in self.commands:
            commands.put(None)
        for worker in self.workers:
            worker.join(timeout=10)
            if worker.is_alive():
                worker.terminate()
                worker.join()


def _worker(
    rank: int, processes: int, model: nn.Module, data: DataSplits, config: TrainConfig, threads: int,
    commands: multiprocessing.queues.Queue[int | None], results: multiprocessing.queues.Queue[Any],
) -> None:  # fmt: skip
    """One Hogwild worker: for each epoch it is told, SGD steps on its shard straight into the shared model."""
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    set_threads(threads)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    per_worker = samples_per_rank(len(data.train_y), processes)
    steps = math.ceil(per_worker / config.batch_size)
    progress = ProgressReporter(config.out_dir / "progress.json", config.epochs, steps) if rank == 0 else None
    kill_step = config.fault_kill[1] if config.fault_kill and config.fault_kill[0] == rank else None
    results.put((0.0, 0.0, 0.0))  # ready
    while (epoch := commands.get()) is not None:
        seed_rng(config.seed + 1000 * epoch, rank)  # this worker's dropout stream, the same on a resumed run
        order = shard_indices(len(data.train_y), processes, rank, epoch - 1, config.seed)
        sums = torch.zeros(2, dtype=torch.float64)
        model.train()
        start = time.perf_counter()
        for step in range(steps):
            if kill_step == (epoch - 1) * steps + step + 1:
                os.kill(os.getpid(), signal.SIGKILL)
            batch = order[step * config.batch_size : (step + 1) * config.batch_size]
            images, labels = data.train_x.index_select(0, batch), data.train_y.index_select(0, batch)
            optimizer.zero_grad(set_to_none=True)
            output = model(images)
            loss = F.nll_loss(output, labels)
            loss.backward()
            optimizer.step()  # lock-free: the other workers update the same parameters meanwhile
            with torch.no_grad():
                sums[0] += loss.detach() * labels.shape[0]
                sums[1] += (output.argmax(dim=1) == labels).sum()
            if progress is not None and progress.due():
                rate = (step + 1) * config.batch_size * processes / max(time.perf_counter() - start, 1e-9)
                progress.write(epoch=epoch, step=step + 1, samples_per_s=rate, state="training")
        results.put((float(sums[0]), float(sums[1]), float(per_worker)))


def run(config: TrainConfig, backend: str, data_dir: Path, options: StrategyOptions) -> None:
    """Read the data, build the shared model, train with the workers."""
    del backend  # no process group: the workers share memory
    processes = process_count(options, 0)
    threads = threads_per_process(options, processes)
    set_threads(threads)  # the coordinator validates while the workers wait
    data = read_data(config, data_dir)
    model = initial_model(config, data)
    HogwildTrainer(config, data, model, options, processes, threads).train()


def _warn(message: str) -> None:
    print(f"trainer[hogwild] warning: {message}", file=sys.stderr, flush=True)


def _state_bytes(state: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()
