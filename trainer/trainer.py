"""The Trainer: DistributedDataParallel training over tensors already in memory, with per-epoch metrics
reduced once, atomic per-node snapshots and exact resume after the last finished epoch.
"""

from __future__ import annotations

import io
import math
import os
import signal
import sys
import time
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainer import requeue, stack_dumps
from trainer.comm_share import exposed_comm
from trainer.data import DataSplits
from trainer.determinism import capture_rng, restore_rng, seed_rng
from trainer.distributed import DistContext, device_name
from trainer.errors import SnapshotError
from trainer.files import atomic_write_bytes
from trainer.graphed_step import GraphedStep
from trainer.records import build_summary, versions, write_summary
from trainer.requeue import STOP_CHECK_STEPS, StoppedForRequeue
from trainer.run_log import RunLog
from trainer.sharding import samples_per_rank, shard_indices
from trainer.snapshot import newest_valid_position, save_snapshot, snapshot_path

EVAL_BATCH_SIZE = 1024
SNAPSHOT_FORMAT = 1
# Settings that must match for a snapshot to be resumed (epochs may grow: a run can be extended).
RUN_IDENTITY = ("model", "dataset", "batch_size", "lr", "momentum", "seed", "synthetic_train_size",
                "synthetic_test_size")  # fmt: skip
PRECISIONS = ("fp32", "bf16")
# A snapshot's place (epochs finished, steps into the next) as one integer, for the nodes to agree on with a min.
POSITION_SPAN = 10**9


@dataclass(frozen=True)
class TrainConfig:
    """The experiment's settings, as given on the command line."""

    model: str = "mnist-cnn"
    dataset: str = "synthetic"
    epochs: int = 3
    batch_size: int = 32
    lr: float = 0.01
    momentum: float = 0.0
    save_every: int = 1
    keep_snapshots: int = 3
    seed: int = 0
    out_dir: Path = Path()
    snapshot_dir: Path | None = None
    synthetic_train_size: int = 16384
    synthetic_test_size: int = 2048
    fault_kill: tuple[int, int] | None = None  # (global rank, global step), first attempt only
    fault_hang: tuple[int, int] | None = None  # likewise: that rank stops responding (a hung collective)
    step_pause: float = 0.0  # seconds every rank sleeps after each step: a long run that leaves the CPU to others
    precision: str = "fp32"  # bf16: forward and loss under bf16 autocast (weights and optimizer stay fp32)
    deterministic: bool = False  # torch.use_deterministic_algorithms: bitwise repeatable on CUDA too
    channels_last: bool = True  # images and weights stored channels-last (faster; rounds differently from NCHW)
    cuda_graphs: bool = True  # a world of one on CUDA replays the captured step (trainer/graphed_step.py)

    def identity(self) -> dict[str, Any]:
        identity = {key: asdict(self)[key] for key in RUN_IDENTITY}
        if self.precision != "fp32":  # so that snapshots written before the option existed still resume
            identity["precision"] = self.precision
        return identity


@dataclass
class EpochResult:
    seconds: float
    steps: int
    samples: int
    loss: float
    acc: float


class Trainer:
    """Trains `model` on `data` with DDP; snapshots let a restarted job continue after its last saved epoch."""

    def __init__(self, config: TrainConfig, ctx: DistContext, data: DataSplits, model: nn.Module) -> None:
        self.config = config
        self.ctx = ctx
        stack_dumps.register(ctx.rank, ctx.world_size, config.out_dir)  # `ddpctl stacks`, a stalled run's verdict
        self.data = data.to(ctx.device)
        if config.channels_last:
            self.data = self.data.channels_last()
        self.model = self._place(model)
        self.ddp: nn.Module = self._wrap(self.model)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=config.lr, momentum=config.momentum)
        self.graphed = (
            GraphedStep(self._run_batch, self.model, self.optimizer, self.data.train_x, self.data.train_y,
                        config.batch_size)  # fmt: skip
            if self._graphable()
            else None
        )
        self.snapshot_dir = config.snapshot_dir or config.out_dir / "snapshots"
        self.per_rank = samples_per_rank(len(self.data.train_y), ctx.world_size)
        self.steps_per_epoch = math.ceil(self.per_rank / config.batch_size)
        self.epochs_done = 0
        # Resuming a snapshot taken mid-epoch (a stop for a requeue): steps done in the next epoch, its metric sums
        # and training seconds so far; None otherwise.
        self.resume_within: tuple[int, torch.Tensor, float] | None = None
        self.stop = requeue.current()
        self.records: list[dict[str, Any]] = []
        self.wall_start = time.time()
        self.first_step_time: float | None = None  # this attempt's first optimizer step (launch benchmarks)
        # Rank 0 tells each epoch: timing.jsonl, a line on stdout, scalars.csv, TensorBoard (trainer/run_log.py).
        self.timing = RunLog(config.out_dir, lambda: self.optimizer.param_groups[0]["lr"]) if ctx.is_rank0 else None
        self.progress = self.timing.progress(config.epochs, self.steps_per_epoch) if self.timing else None

    def _place(self, model: nn.Module) -> nn.Module:
        """The model on this process's device (strategies that split it across devices override this)."""
        model = model.to(self.ctx.device)
        if self.config.channels_last:
            # CPU max_pool2d is ~5x faster on channels-last tensors than on NCHW (a whole mnist-cnn step takes half
            # the time), and cuDNN's tensor-core convolutions work in it. The maths is the same, the rounding not.
            model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        return model

    def _wrap(self, model: nn.Module) -> nn.Module:
        """What trains: DDP over the process group (other strategies override this). A world of one has no
        gradients to average: DDP would only add a one-rank all-reduce per step."""
        device_ids = [self.ctx.device.index] if self.ctx.device.type == "cuda" else None
        several = self.ctx.grouped and self.ctx.world_size > 1
        return DistributedDataParallel(model, device_ids=device_ids) if several else model

    def _graphable(self) -> bool:
        """Whether the step can be captured once and replayed: one CUDA device, the plain model, this class's step
        (strategies that wrap, split or change the step run it as written)."""
        return (
            self.config.cuda_graphs and self.ctx.device.type == "cuda" and self.ddp is self.model
            and type(self)._run_batch is Trainer._run_batch
            and all(p.device == self.ctx.device for p in self.model.parameters())
        )  # fmt: skip

    # --- one step, one epoch ---------------------------------------------------------------------------

    def _run_batch(self, images: torch.Tensor, labels: torch.Tensor, sums: torch.Tensor) -> None:
        """One optimizer step; adds the batch's loss and correct count to `sums` on the device (no sync)."""
        if self.first_step_time is None:
            self.first_step_time = time.time()
        self.optimizer.zero_grad(set_to_none=True)
        with self._autocast():
            output = self.ddp(images)
            loss = F.nll_loss(output, labels)
        loss.backward()
        self.optimizer.step()
        with torch.no_grad():
            sums[0] += loss.detach() * labels.shape[0]
            sums[1] += (output.argmax(dim=1) == labels).sum()

    def _run_epoch(self, epoch: int) -> EpochResult:
        """Train one epoch (1-based number); metrics are reduced across ranks once, at its end."""
        cfg, ctx = self.config, self.ctx
        order = shard_indices(len(self.data.train_y), ctx.world_size, ctx.rank, epoch - 1, cfg.seed)
        order = order.to(ctx.device)
        sums = self.graphed.sums if self.graphed is not None else torch.zeros(2, dtype=torch.float64, device=ctx.device)
        sums.zero_()
        first_step, seconds_before = 0, 0.0
        if self.resume_within is not None:
            first_step, saved_sums, seconds_before = self.resume_within
            sums.copy_(saved_sums.to(sums.device))
            self.resume_within = None
        kill_step, hang_step = self._fault_step(self.config.fault_kill), self._fault_step(self.config.fault_hang)
        self.ddp.train()
        start = time.perf_counter()
        for step in range(first_step, self.steps_per_epoch):
            global_step = (epoch - 1) * self.steps_per_epoch + step + 1
            if global_step == kill_step:
                os.kill(os.getpid(), signal.SIGKILL)
            while global_step == hang_step and not (self.stop is not None and self.stop.asked):
                time.sleep(3600 if self.stop is None else 0.5)  # a hung step still hears a requeue's signal
            batch = order[step * cfg.batch_size : (step + 1) * cfg.batch_size]
            if self.graphed is not None and len(batch) == cfg.batch_size:
                self.graphed.replay(batch)
            else:  # the plain step (also an epoch's last, shorter batch, which the graph's shapes do not fit)
                self._run_batch(self.data.train_x.index_select(0, batch), self.data.train_y.index_select(0, batch),
                                sums)  # fmt: skip
            if cfg.step_pause:
                time.sleep(cfg.step_pause)
            if self.progress is not None and self.progress.due():
                rate = (step + 1) * cfg.batch_size * ctx.world_size / max(time.perf_counter() - start, 1e-9)
                self.progress.write(epoch=epoch, step=step + 1, samples_per_s=rate, state="training")
            if step + 1 < self.steps_per_epoch and self._stop_agreed(global_step):
                elapsed = seconds_before + time.perf_counter() - start
                self._save_snapshot(within=(step + 1, sums, elapsed))
                raise StoppedForRequeue(epoch, step + 1, self.steps_per_epoch)
        counts = torch.tensor([float(self.per_rank)], dtype=torch.float64, device=ctx.device)
        totals = ctx.all_reduce_sum(torch.cat([sums, counts])).tolist()  # the epoch's one host sync
        seconds = seconds_before + time.perf_counter() - start
        return EpochResult(seconds, self.steps_per_epoch, int(totals[2]), totals[0] / totals[2], totals[1] / totals[2])

    def _autocast(self) -> AbstractContextManager[Any]:
        """bf16 autocast when --precision bf16, else nothing. No cast cache: a CUDA Graph cannot capture one."""
        enabled = self.config.precision == "bf16"
        return torch.autocast(self.ctx.device.type, dtype=torch.bfloat16, enabled=enabled, cache_enabled=False)

    def _fault_step(self, fault: tuple[int, int] | None) -> int | None:
        """The global step at which this rank's test fault strikes (first attempt only), or None."""
        if fault is None or self.ctx.restart_count != 0 or fault[0] != self.ctx.rank:
            return None
        return fault[1]

    @torch.no_grad()
    def _evaluate(self) -> tuple[float, float]:
        """Loss and accuracy on the test split, sharded across ranks (no padding) and summed."""
        ctx = self.ctx
        self.model.eval()
        test_x, test_y = self.data.test_x, self.data.test_y
        mine = torch.arange(ctx.rank, len(test_y), ctx.world_size, device=ctx.device)
        sums = torch.zeros(3, dtype=torch.float64, device=ctx.device)
        for first in range(0, len(mine), EVAL_BATCH_SIZE):
            batch = mine[first : first + EVAL_BATCH_SIZE]
            with self._autocast():
                output = self.model(test_x.index_select(0, batch)).float()
            labels = test_y.index_select(0, batch)
            sums[0] += F.nll_loss(output, labels, reduction="sum")
            sums[1] += (output.argmax(dim=1) == labels).sum()
            sums[2] += labels.shape[0]
        loss_sum, correct, count = ctx.all_reduce_sum(sums).tolist()
        return loss_sum / max(count, 1.0), correct / max(count, 1.0)

    # --- snapshots -------------------------------------------------------------------------------------

    def _stop_agreed(self, global_step: int | None) -> bool:
        """Whether every rank stops here for a requeue (global_step None: an epoch's end, always asked)."""
        if self.stop is None:
            return False
        if not self.ctx.grouped or self.ctx.world_size == 1:
            return self.stop.asked
        if global_step is not None and global_step % STOP_CHECK_STEPS:
            return False
        return self.ctx.min_int(0 if self.stop.asked else 1) == 0

    def _save_snapshot(self, within: tuple[int, torch.Tensor, float] | None = None) -> None:
        """Every rank hands its RNG state to the local rank 0s, which each write one copy for their node.
        `within`: a stop mid-epoch (steps done in the next epoch, its metric sums, its seconds so far)."""
        rng_states = self.ctx.gather_objects(capture_rng(self.ctx.device))
        # Mid-epoch, each rank's own partial metric sums (all-reduced only at the epoch's end) are part of the state.
        rank_sums = self.ctx.gather_objects(within[1].detach().cpu().clone()) if within is not None else []
        if not self._writes_snapshots():
            return
        state = {
            "format": SNAPSHOT_FORMAT,
            "epochs_done": self.epochs_done,
            "identity": self.config.identity(),
            "world_size": self.ctx.world_size,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rng": rng_states,
            "records": self.records,
            "wall_start": self.wall_start,
        }
        if within is not None:
            state["within_epoch"] = {"steps": within[0], "sums": rank_sums, "seconds": within[2]}
        save_snapshot(self.snapshot_dir, self.epochs_done, state, self.config.keep_snapshots,
                      step=within[0] if within else 0)  # fmt: skip

    def _writes_snapshots(self) -> bool:
        """One copy per node, by local rank 0 (local-sgd, whose ranks hold different weights, overrides it)."""
        return self.ctx.local_rank == 0

    def _load_snapshot(self) -> bool:
        """Resume from the newest snapshot that is valid on every node; False when there is none."""
        ctx = self.ctx
        warn = self._warn if ctx.local_rank == 0 else _quiet
        found = newest_valid_position(self.snapshot_dir, warn)
        agreed = ctx.min_int(_code(found[0]) if found else 0)
        # Another node's newest may be older, and this node's copy of that epoch may be pruned or corrupt:
        # each round every rank offers its newest valid one up to the agreed epoch, until all offer the same.
        while agreed:
            if found is None or _code(found[0]) != agreed:
                found = newest_valid_position(self.snapshot_dir, warn, at_most=divmod(agreed, POSITION_SPAN))
            offered = ctx.min_int(_code(found[0]) if found else 0)
            if offered == agreed:
                break
            agreed = offered
        if agreed == 0:
            return False
        assert found is not None
        (agreed_epoch, agreed_step), state = found
        path = snapshot_path(self.snapshot_dir, agreed_epoch, agreed_step)
        if state.get("format") != SNAPSHOT_FORMAT or state.get("identity") != self.config.identity():
            raise SnapshotError(
                f"{path} belongs to another run "
                f"({state.get('identity')}); use another --snapshot-dir or remove it"
            )
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        within = state.get("within_epoch")
        if within is not None:
            if state["world_size"] != ctx.world_size:
                raise SnapshotError(f"{path} stopped mid-epoch with {state['world_size']} processes, not "
                                    f"{ctx.world_size}: resume it with as many, or remove it to resume from the "
                                    "epoch before")
            self.resume_within = (int(within["steps"]), within["sums"][ctx.rank], float(within["seconds"]))
        rng_states = state["rng"]
        if state["world_size"] == ctx.world_size:
            restore_rng(rng_states[ctx.rank], ctx.device)
        else:
            self._warn(
                f"snapshot was taken by {state['world_size']} processes, now {ctx.world_size}: "
                "dropout RNG reseeded, the run will not match an uninterrupted one bit for bit"
            )
            seed_rng(self.config.seed + 1000 * agreed_epoch, ctx.rank)
        self.records = list(state["records"])
        self.wall_start = float(state["wall_start"])
        self.epochs_done = int(state["epochs_done"])
        if ctx.local_rank == 0:
            where = f", step {agreed_step}/{self.steps_per_epoch} of epoch {agreed_epoch + 1}" if agreed_step else ""
            self._warn(f"resuming after epoch {self.epochs_done}{where} from {path}")
        return True

    def _warn(self, message: str) -> None:
        print(f"trainer[rank {self.ctx.rank}] warning: {message}", file=sys.stderr, flush=True)

    # --- the whole run ---------------------------------------------------------------------------------

    def train(self) -> dict[str, Any]:
        """Train the remaining epochs, report, snapshot; returns the summary (on every rank)."""
        cfg, ctx = self.config, self.ctx
        self._load_snapshot()
        if self.timing is not None:
            self.timing.rewrite(self.records)
        for epoch in range(self.epochs_done + 1, cfg.epochs + 1):
            result = self._run_epoch(epoch)
            if self.progress is not None:
                self.progress.write(
                    epoch=epoch, step=result.steps, samples_per_s=result.samples / result.seconds, state="validating"
                )
            val_start = time.perf_counter()
            val_loss, val_acc = self._evaluate()
            record = {
                "epoch": epoch, "epochs": cfg.epochs, "seconds": result.seconds,
                "val_seconds": time.perf_counter() - val_start, "samples": result.samples,
                "samples_per_s": result.samples / result.seconds, "steps": result.steps,
                "train_loss": result.loss, "train_acc": result.acc, "val_loss": val_loss, "val_acc": val_acc,
                "world_size": ctx.world_size, "restart_count": ctx.restart_count, "time": time.time(),
            }  # fmt: skip
            self.records.append(record)
            if self.timing is not None:
                self.timing.rewrite(self.records)  # atomic: a full disk cannot leave half a line
            self.epochs_done = epoch
            saved = epoch % cfg.save_every == 0 or epoch == cfg.epochs
            if saved:
                self._save_snapshot()
            if epoch < cfg.epochs and self._stop_agreed(None):
                if not saved:
                    self._save_snapshot()
                raise StoppedForRequeue(epoch + 1, 0, self.steps_per_epoch)
        return self._finish()

    def _finish(self) -> dict[str, Any]:
        devices = self.ctx.gather_objects(device_name(self.ctx.device))
        summary = build_summary(self.records, wall_start=self.wall_start, restarts=self.ctx.restart_count,
                                extra={**self._summary_extra(devices), **exposed_comm(self)})  # fmt: skip
        if self.ctx.is_rank0:
            out = self.config.out_dir
            atomic_write_bytes(out / "final_model.pt", _state_bytes(self.model.state_dict()))
            write_summary(out / "summary.json", summary)
            if self.progress is not None:
                last = self.records[-1] if self.records else {"samples_per_s": 0.0}
                self.progress.write(epoch=self.epochs_done, step=self.steps_per_epoch,
                                    samples_per_s=last["samples_per_s"], state="done")  # fmt: skip
        return summary

    def _summary_extra(self, devices: list[str]) -> dict[str, Any]:
        cfg = self.config
        return {
            "world_size": self.ctx.world_size, "nnodes": self.ctx.nnodes, "model": cfg.model,
            "dataset": cfg.dataset, "batch_size": cfg.batch_size, "lr": cfg.lr, "momentum": cfg.momentum,
            "seed": cfg.seed, "versions": versions(), "devices": devices, "first_step_time": self.first_step_time,
            "precision": cfg.precision, "deterministic": cfg.deterministic, "cuda_graphs": self.graphed is not None,
            "channels_last": cfg.channels_last,
        }  # fmt: skip


def _code(position: tuple[int, int]) -> int:
    return position[0] * POSITION_SPAN + position[1]


def _quiet(message: str) -> None:
    """Other local ranks read the same files: only local rank 0 names the bad ones."""


def _state_bytes(state: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()
