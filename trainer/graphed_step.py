"""The CUDA fast path: the whole training step captured once as a CUDA Graph, then replayed step after step.

At batch 32 a step of a small network is a few hundred kernels of a few microseconds each, so Python and the
launch queue, not the GPU, set the pace (measured: 2.2 ms per mnist-cnn step on an H100, most of it launches).
A replay launches the captured step in one call: gathering the batch from the data set already resident on the
GPU, forward, backward, the optimizer's update and the metric sums, with no host sync.

Numerics are the plain step's: the same kernels on the same batches, and dropout draws the same Philox numbers
(PyTorch advances the CUDA generator by the graph's draws at each replay, as the eager ops would). Warm-up steps
run on a side stream and are then rolled back (weights, optimizer state, RNG), so every step of every epoch is
the same replay whether the run is fresh or resumed from a snapshot.

Only for a world of one: a step of several processes holds DDP's gradient all-reduce, which is not captured here.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable

import torch
from torch import nn

WARMUP_STEPS = 3  # PyTorch's whole-network capture example warms up 3 iterations (cuDNN/cuBLAS pick and allocate)

StepFunction = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]


class GraphedStep:
    """One training step over `train_x`/`train_y` (resident on the GPU) as a replayable CUDA Graph.

    `step(images, labels, sums)` is the trainer's plain step; it is captured once, on the first `replay`.
    Metric sums accumulate in `sums`, a tensor of this object's (the captured addresses must not move).
    """

    def __init__(self, step: StepFunction, model: nn.Module, optimizer: torch.optim.Optimizer,
                 train_x: torch.Tensor, train_y: torch.Tensor, batch_size: int) -> None:  # fmt: skip
        self.step = step
        self.model = model
        self.optimizer = optimizer
        self.train_x = train_x
        self.train_y = train_y
        self.batch_size = batch_size
        device = train_x.device
        self.batch_index = torch.zeros(batch_size, dtype=torch.int64, device=device)
        self.sums = torch.zeros(2, dtype=torch.float64, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.capture_seconds = 0.0  # warm-up and capture, once per process (cuDNN's algorithm search included)

    def replay(self, batch: torch.Tensor) -> None:
        """Train on the samples at indices `batch` (exactly batch_size of them, on the GPU)."""
        self.batch_index.copy_(batch)
        if self.graph is None and self._capture():
            return  # the capture trained on this batch already
        assert self.graph is not None
        self.graph.replay()

    def _step_on_index(self) -> None:
        images = self.train_x.index_select(0, self.batch_index)
        labels = self.train_y.index_select(0, self.batch_index)
        self.step(images, labels, self.sums)

    def _capture(self) -> bool:
        """Warm up, then capture; True when this trained on the current batch (an eager first step)."""
        start = time.perf_counter()
        saved_sums = self.sums.clone()
        state_before = len(self.optimizer.state)
        with _rolled_back(self.model, self.optimizer):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(WARMUP_STEPS):
                    self._step_on_index()
            torch.cuda.current_stream().wait_stream(side)
            state_after = len(self.optimizer.state)
        self.sums.copy_(saved_sums)
        # The optimizer may make its state on its first step (SGD's momentum buffers): captured, that first
        # step would make it anew on every replay. It runs eagerly instead, then the next step is captured.
        trained = state_after > state_before
        if trained:
            self._step_on_index()
        # The step sets the gradients to None first, so backward allocates them inside the graph's memory pool.
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._step_on_index()
        self.graph = graph  # capture records kernels without running them
        self.capture_seconds = time.perf_counter() - start
        return trained


class _rolled_back:
    """Puts weights, buffers, optimizer state and the CPU and CUDA RNG back as they were on entry."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer

    def __enter__(self) -> None:
        self.weights = {name: value.detach().clone() for name, value in self.model.state_dict().items()}
        self.optimizer_state = copy.deepcopy(self.optimizer.state_dict())
        self.cpu_rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state()

    def __exit__(self, *exc: object) -> None:
        torch.cuda.synchronize()
        self.model.load_state_dict(self.weights)  # copies in place: the parameters keep their addresses
        self.optimizer.load_state_dict(self.optimizer_state)
        torch.set_rng_state(self.cpu_rng)
        torch.cuda.set_rng_state(self.cuda_rng)
