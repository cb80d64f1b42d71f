"""The strategies on GPUs: DataParallel over the node's GPUs, the model split across two GPUs, NCCL under spawn,
local-sgd and ddp-mp. With one GPU the single-GPU forms run and the two-GPU ones are skipped, saying why."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.trainer_support import describe, read_json, read_timing, run_torchrun, run_trainer
from trainer.models import build_model
from trainer.strategies.split import SplitModel

pytestmark = pytest.mark.gpu
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
needs_gpu = pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU (none here)")
needs_two = pytest.mark.skipif(GPUS < 2, reason=f"needs two CUDA GPUs (this machine has {GPUS})")
RUN = ["--epochs", "2", "--synthetic-train-size", "4096", "--synthetic-test-size", "512", "--lr", "0.05",
       "--seed", "3"]  # fmt: skip


def _finished(result: object, out: Path) -> dict[str, object]:
    assert getattr(result, "returncode", None) == 0, describe(result)  # type: ignore[arg-type]
    timing = read_timing(out)
    assert [r["epoch"] for r in timing] == [1, 2] and timing[-1]["val_acc"] > 0.3
    summary: dict[str, object] = read_json(out / "summary.json")
    return summary


@needs_gpu
def test_dp_drives_every_gpu_of_the_node(tmp_path: Path) -> None:
    summary = _finished(run_trainer([*RUN, "--strategy", "dp", "--out-dir", str(tmp_path)]), tmp_path)
    assert summary["strategy"] == "dp"
    assert summary["data_parallel_devices"] == [f"cuda:{i}" for i in range(GPUS)]
    assert str(summary["devices"]).startswith("['cuda:0")


@needs_gpu
@pytest.mark.parametrize("second", [0, 1])
def test_split_on_gpus_gives_the_unsplit_loss_and_gradients(second: int) -> None:
    if second >= GPUS:
        pytest.skip(f"needs two CUDA GPUs (this machine has {GPUS})")
    devices = (torch.device("cuda", 0), torch.device("cuda", second))
    torch.manual_seed(5)
    whole = build_model("mnist-cnn-small", (1, 28, 28)).to(devices[0]).eval()  # eval: no dropout masks to match
    torch.manual_seed(5)
    split = SplitModel(build_model("mnist-cnn-small", (1, 28, 28)).to(devices[0]), devices).eval()
    images = torch.randn(64, 1, 28, 28, device=devices[0])
    labels = torch.randint(0, 10, (64,), device=devices[0])
    losses = []
    for model in (whole, split):
        loss = F.nll_loss(model(images), labels)
        loss.backward()
        losses.append(loss.detach())
    assert torch.allclose(losses[0], losses[1], rtol=1e-5)
    assert dict(split.model.named_parameters())["fc2.weight"].device == devices[1]
    for (name, p), q in zip(whole.named_parameters(), split.model.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None
        assert torch.allclose(p.grad, q.grad.to(devices[0]), rtol=1e-4, atol=1e-6), name


@needs_gpu
def test_mp_single_gpu_form_trains(tmp_path: Path) -> None:
    args = [*RUN, "--strategy", "mp", "--devices", "cuda:0,cuda:0", "--out-dir", str(tmp_path)]
    summary = _finished(run_trainer(args), tmp_path)
    assert summary["stage_devices"] == ["cuda:0", "cuda:0"]


@needs_two
def test_mp_across_two_gpus_trains(tmp_path: Path) -> None:
    summary = _finished(run_trainer([*RUN, "--strategy", "mp", "--out-dir", str(tmp_path)]), tmp_path)
    assert summary["stage_devices"] == ["cuda:0", "cuda:1"]


@needs_gpu
def test_spawn_one_process_per_gpu_with_nccl(tmp_path: Path) -> None:
    summary = _finished(run_trainer([*RUN, "--strategy", "spawn", "--out-dir", str(tmp_path)]), tmp_path)
    assert summary["world_size"] == GPUS and all(str(d).startswith("cuda:") for d in summary["devices"])  # type: ignore[attr-defined]


@needs_two
def test_local_sgd_over_nccl(tmp_path: Path) -> None:
    args = [*RUN, "--strategy", "local-sgd", "--average-every", "4", "--out-dir", str(tmp_path)]
    summary = _finished(run_torchrun(args, nproc=2), tmp_path)
    assert summary["strategy"] == "local-sgd" and summary["world_size"] == 2


@needs_two
def test_ddp_mp_two_gpus_per_process(tmp_path: Path) -> None:
    args = [*RUN, "--strategy", "ddp-mp", "--out-dir", str(tmp_path)]
    summary = _finished(run_torchrun(args, nproc=GPUS // 2), tmp_path)
    assert summary["stage_devices"] == ["cuda:0", "cuda:1"] and summary["world_size"] == GPUS // 2
