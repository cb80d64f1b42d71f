"""The trainer's parts in one process: sharding against DistributedSampler, the real file formats' readers,
snapshots (checksums, atomic files, pruning), models, and the command line's one-line errors."""

from __future__ import annotations

import gzip
import io
import json
import pickle
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset
from torch.utils.data.distributed import DistributedSampler

from tests.trainer_support import describe, run_trainer, torchvision_importable
from trainer.data import load_dataset, read_cifar10, read_idx, read_mnist, synthetic_images
from trainer.errors import DataError, SnapshotError, TrainerError
from trainer.models import MnistCnn, build_model
from trainer.sharding import samples_per_rank, shard_indices
from trainer.snapshot import list_snapshots, newest_valid, read_snapshot, save_snapshot, snapshot_path

NO_TORCHVISION = "needs torchvision, which has no CPU build here; runs on the GPU machine"


# --- sharding ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "world", "seed", "drop_last", "shuffle"),
    [(10, 1, 0, False, True), (10, 3, 0, False, True), (4095, 2, 3, False, True), (7, 4, 11, False, True),
     (2, 5, 1, False, True), (10, 3, 5, True, True), (11, 4, 2, True, True), (10, 3, 0, False, False),
     (9, 4, 0, True, False)],
)  # fmt: skip
def test_shards_equal_distributed_sampler(n: int, world: int, seed: int, drop_last: bool, shuffle: bool) -> None:
    dataset = TensorDataset(torch.arange(n))
    for rank in range(world):
        for epoch in (0, 1, 7):
            sampler: DistributedSampler[Any] = DistributedSampler(
                dataset, num_replicas=world, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last
            )
            sampler.set_epoch(epoch)
            ours = shard_indices(n, world, rank, epoch, seed, shuffle=shuffle, drop_last=drop_last)
            assert ours.tolist() == list(sampler), (n, world, rank, epoch, seed)
            assert len(ours) == samples_per_rank(n, world, drop_last) == len(sampler)


def test_shards_reshuffle_per_epoch_and_cover_the_data() -> None:
    first = torch.cat([shard_indices(100, 4, r, 0, 0) for r in range(4)])
    second = torch.cat([shard_indices(100, 4, r, 1, 0) for r in range(4)])
    assert sorted(first.tolist()) == list(range(100)) == sorted(second.tolist())
    assert first.tolist() != second.tolist()


# --- synthetic data ------------------------------------------------------------------------------------


def test_synthetic_is_deterministic_mnist_shaped_and_seed_dependent() -> None:
    x1, y1 = synthetic_images(300, seed=5)
    x2, y2 = synthetic_images(300, seed=5)
    x3, _ = synthetic_images(300, seed=6)
    test_x, _ = synthetic_images(300, seed=5, split=1)
    assert x1.shape == (300, 1, 28, 28) and x1.dtype == torch.uint8 and y1.dtype == torch.int64
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(x1, x3) and not torch.equal(x1, test_x)
    assert set(y1.tolist()) == set(range(10))


def test_synthetic_normalised_like_mnist() -> None:
    data = load_dataset("synthetic", Path("unused"), seed=0, synthetic_train_size=64, synthetic_test_size=32)
    raw, _ = synthetic_images(64, seed=0)
    expected = (raw.float() / 255 - 0.1307) / 0.3081
    assert torch.allclose(data.train_x, expected)
    assert data.test_x.shape == (32, 1, 28, 28) and data.image_shape == (1, 28, 28)


# --- MNIST IDX files -----------------------------------------------------------------------------------


def _idx_bytes(array: np.ndarray, code: int = 0x08) -> bytes:
    big_endian = array.astype(array.dtype.newbyteorder(">"))
    return bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + big_endian.tobytes()


def _write_mnist(folder: Path, gz: bool, n_train: int = 6, n_test: int = 4) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train, dtype=np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    folder.mkdir(parents=True, exist_ok=True)
    for name, array in arrays.items():
        data = _idx_bytes(array)
        if gz:
            (folder / f"{name}.gz").write_bytes(gzip.compress(data))
        else:
            (folder / name).write_bytes(data)
    return arrays


@pytest.mark.parametrize(("gz", "torchvision_layout"), [(False, False), (True, True), (True, False)])
def test_mnist_reader_raw_and_gz(tmp_path: Path, gz: bool, torchvision_layout: bool) -> None:
    folder = tmp_path / "MNIST" / "raw" if torchvision_layout else tmp_path
    arrays = _write_mnist(folder, gz)
    (train_x, train_y), (test_x, test_y) = read_mnist(tmp_path)
    assert train_x.shape == (6, 1, 28, 28) and train_x.dtype == torch.uint8
    assert np.array_equal(train_x[:, 0].numpy(), arrays["train-images-idx3-ubyte"])
    assert train_y.tolist() == arrays["train-labels-idx1-ubyte"].tolist() and train_y.dtype == torch.int64
    assert np.array_equal(test_x[:, 0].numpy(), arrays["t10k-images-idx3-ubyte"])
    assert test_y.tolist() == arrays["t10k-labels-idx1-ubyte"].tolist()


def test_idx_reader_multibyte_big_endian_and_bad_files(tmp_path: Path) -> None:
    values = np.array([[1, -2, 70000], [3, 4, -5]], dtype=np.int32)
    (tmp_path / "ints").write_bytes(_idx_bytes(values, code=0x0C))
    assert read_idx(tmp_path / "ints").tolist() == values.tolist()
    (tmp_path / "bad").write_bytes(b"\x01\x02\x08\x01" + b"\x00" * 8)
    with pytest.raises(DataError, match="bad magic number"):
        read_idx(tmp_path / "bad")
    (tmp_path / "short").write_bytes(_idx_bytes(np.zeros((4, 28, 28), np.uint8))[:-10])
    with pytest.raises(DataError, match="truncated"):
        read_idx(tmp_path / "short")
    (tmp_path / "notgz.gz").write_bytes(b"not gzip at all")
    with pytest.raises(DataError, match="cannot read"):
        read_idx(tmp_path / "notgz.gz")


def test_mnist_loaded_normalised(tmp_path: Path) -> None:
    arrays = _write_mnist(tmp_path, gz=True)
    data = load_dataset("mnist", tmp_path)
    expected = (torch.from_numpy(arrays["t10k-images-idx3-ubyte"]).float() / 255 - 0.1307) / 0.3081
    assert torch.allclose(data.test_x[:, 0], expected)


# --- CIFAR-10 pickle batches ---------------------------------------------------------------------------


def _write_cifar(folder: Path, per_batch: int = 3) -> dict[str, dict[bytes, Any]]:
    rng = np.random.default_rng(1)
    folder.mkdir(parents=True, exist_ok=True)
    batches = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch: dict[bytes, Any] = {
            b"batch_label": name.encode(),
            b"labels": [int(v) for v in rng.integers(0, 10, per_batch)],
            b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
            b"filenames": [f"img{i}.png".encode() for i in range(per_batch)],
        }
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
        batches[name] = batch
    return batches


def test_cifar_reader(tmp_path: Path) -> None:
    batches = _write_cifar(tmp_path / "cifar-10-batches-py")
    (train_x, train_y), (test_x, test_y) = read_cifar10(tmp_path)
    assert train_x.shape == (15, 3, 32, 32) and test_x.shape == (3, 3, 32, 32)
    first = batches["data_batch_1"][b"data"]
    assert isinstance(first, np.ndarray)
    # Rows hold 1024 red, then 1024 green, then 1024 blue values, row-major.
    assert train_x[0, 1, 0, 5].item() == first[0, 1024 + 5]
    assert train_x[0, 2, 31, 31].item() == first[0, 3071]
    assert train_y[:3].tolist() == batches["data_batch_1"][b"labels"]
    assert test_y.tolist() == batches["test_batch"][b"labels"]
    data = load_dataset("cifar10", tmp_path)
    assert torch.allclose(data.test_x, (test_x.float() / 255 - 0.5) / 0.5)


def test_cifar_reader_refuses_code_in_pickles(tmp_path: Path) -> None:
    _write_cifar(tmp_path)

    class Evil:
        def __reduce__(self) -> tuple[Any, ...]:
            return (print, ("pwned",))

    (tmp_path / "test_batch").write_bytes(pickle.dumps({b"data": Evil(), b"labels": []}))
    with pytest.raises(DataError, match="not allowed"):
        read_cifar10(tmp_path)


@pytest.mark.skipif(torchvision_importable(), reason="with torchvision the trainer downloads instead")
@pytest.mark.parametrize(("dataset", "expected"), [("mnist", "train-images-idx3-ubyte"), ("cifar10", "data_batch_1")])
def test_missing_data_is_one_line_error(tmp_path: Path, dataset: str, expected: str) -> None:
    empty = tmp_path / "nothing-here"
    empty.mkdir()
    result = run_trainer(["--dataset", dataset, "--data-dir", str(empty), "--out-dir", str(tmp_path / "out")])
    assert result.returncode == 2, describe(result)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, describe(result)
    assert lines[0].startswith("error: ") and str(empty) in lines[0] and expected in lines[0]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out" / "summary.json").exists()


@pytest.mark.skipif(not torchvision_importable(), reason=NO_TORCHVISION)
def test_mnist_download_through_torchvision(tmp_path: Path) -> None:
    try:
        (train_x, _), (test_x, _) = read_mnist(tmp_path)
    except DataError as exc:
        if "download" in str(exc).lower():
            pytest.skip(f"torchvision is here but the download failed (no internet?): {exc}")
        raise
    assert train_x.shape == (60000, 1, 28, 28) and test_x.shape == (10000, 1, 28, 28)


# --- models --------------------------------------------------------------------------------------------


def test_mnist_cnn_shape_and_log_probabilities() -> None:
    torch.manual_seed(0)
    model = build_model("mnist-cnn", (1, 28, 28))
    assert isinstance(model, MnistCnn) and model.flat_features == 320
    assert [tuple(p.shape) for p in model.parameters()] == [
        (10, 1, 5, 5), (10,), (20, 10, 5, 5), (20,), (50, 320), (50,), (10, 50), (10,),
    ]  # fmt: skip
    model.eval()
    out = model(torch.randn(4, 1, 28, 28))
    assert out.shape == (4, 10)
    assert torch.allclose(out.exp().sum(dim=1), torch.ones(4))
    assert build_model("mnist-cnn", (3, 32, 32))(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_resnet18_without_torchvision_is_a_clear_error() -> None:
    if torchvision_importable():
        pytest.skip("torchvision is importable here")
    with pytest.raises(TrainerError, match="needs torchvision"):
        build_model("resnet18", (1, 28, 28))


@pytest.mark.skipif(not torchvision_importable(), reason=NO_TORCHVISION)
def test_resnet18_on_mnist_and_cifar_shapes() -> None:
    model = build_model("resnet18", (1, 28, 28)).eval()
    assert model(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


# --- snapshots -----------------------------------------------------------------------------------------


def _state(epoch: int) -> dict[str, object]:
    return {"epochs_done": epoch, "weights": torch.full((3,), float(epoch)), "records": [{"epoch": epoch}]}


def test_snapshot_round_trip_and_keeps_last_k(tmp_path: Path) -> None:
    for epoch in range(1, 6):
        save_snapshot(tmp_path, epoch, _state(epoch), keep=3)
    assert [e for e, _ in list_snapshots(tmp_path)] == [5, 4, 3]
    state = read_snapshot(snapshot_path(tmp_path, 4))
    assert state["epochs_done"] == 4 and torch.equal(state["weights"], torch.full((3,), 4.0))
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("damage", ["truncate", "flip", "header"])
def test_corrupt_newest_snapshot_falls_back_and_names_it(tmp_path: Path, damage: str) -> None:
    for epoch in (1, 2):
        save_snapshot(tmp_path, epoch, _state(epoch), keep=3)
    newest = snapshot_path(tmp_path, 2)
    raw = bytearray(newest.read_bytes())
    if damage == "truncate":
        newest.write_bytes(raw[: len(raw) // 2])
    elif damage == "flip":
        raw[-20] ^= 0xFF
        newest.write_bytes(raw)
    else:
        newest.write_bytes(raw[10:])
    (tmp_path / ".snapshot-epoch-000003.pt.tmp-x1y2").write_bytes(b"half a snapshot")
    warnings: list[str] = []
    found = newest_valid(tmp_path, warnings.append)
    assert found is not None and found[0] == 1 and found[1]["epochs_done"] == 1
    assert len(warnings) == 1 and str(newest) in warnings[0]
    with pytest.raises(SnapshotError):
        read_snapshot(newest)


def test_snapshot_payload_cannot_run_code(tmp_path: Path) -> None:
    # A checksum only proves integrity; loading must still refuse arbitrary objects (weights_only).
    class Evil:
        def __reduce__(self) -> tuple[Any, ...]:
            return (print, ("pwned",))

    import hashlib

    payload = pickle.dumps({"x": Evil()}, protocol=2)
    buffer = io.BytesIO()
    buffer.write(b"DDPCTL-SNAPSHOT 1 sha256=" + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
    path = snapshot_path(tmp_path, 1)
    path.write_bytes(buffer.getvalue())
    with pytest.raises(SnapshotError, match="cannot be loaded"):
        read_snapshot(path)


# --- command line --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--epochs", "0"], "--epochs"), (["--fault-kill", "1-40"], "RANK:STEP"), (["--model", "vgg"], "--model"),
     (["--lr", "abc"], "--lr"), (["--step-pause", "-1"], "--step-pause"),
     (["--strategy", "hogwild", "--step-pause", "0.5"], "--step-pause applies to")],
)  # fmt: skip
def test_bad_options_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    from trainer.__main__ import parse_args

    with pytest.raises(SystemExit) as exit_info:
        parse_args([*args, "--out-dir", str(tmp_path)])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]


@pytest.mark.integration
def test_step_pause_makes_every_step_last_at_least_that_long(tmp_path: Path) -> None:
    """The tests' slow run: 64 samples in steps of 16 with 0.25 s after each: the epoch's measured time holds the
    four pauses (its samples/s with it)."""
    result = run_trainer(["--epochs", "1", "--batch-size", "16", "--synthetic-train-size", "64",
                          "--synthetic-test-size", "16", "--step-pause", "0.25", "--out-dir", str(tmp_path)])
    assert result.returncode == 0, describe(result)
    (epoch,) = [json.loads(line) for line in (tmp_path / "timing.jsonl").read_text().splitlines()]
    assert epoch["steps"] == 4 and epoch["seconds"] >= 1.0 and epoch["samples_per_s"] <= 64


def test_bf16_run_records_its_precision_and_its_snapshots_resume_only_bf16(tmp_path: Path) -> None:
    tiny = ["--epochs", "1", "--synthetic-train-size", "256", "--synthetic-test-size", "64", "--out-dir", str(tmp_path)]
    result = run_trainer([*tiny, "--precision", "bf16"])
    assert result.returncode == 0, describe(result)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["precision"] == "bf16" and summary["final_train_loss"] > 0
    weights = torch.load(tmp_path / "final_model.pt", weights_only=True)
    assert all(value.dtype == torch.float32 for value in weights.values())  # autocast leaves the weights fp32
    result = run_trainer([*tiny, "--epochs", "2"])  # fp32 now: bf16's snapshot must not be resumed
    assert result.returncode == 2 and "belongs to another run" in result.stderr, describe(result)


def test_a_clean_end_after_a_torn_down_group_skips_the_interpreters_teardown(monkeypatch: pytest.MonkeyPatch) -> None:
    """gloo can abort a rank in C++ teardown after a clean end: the trainer then leaves by os._exit; a failing
    rank, or a process that never had a group (a world of one, hogwild's coordinator), through Python's exit."""
    import trainer.__main__ as entry

    skipped: list[int] = []

    def exit_without_teardown(code: int) -> None:
        skipped.append(code)
        raise SystemExit(code)

    monkeypatch.setattr(entry.failure, "exit_without_teardown", exit_without_teardown)
    for torn_down, code, expected in ((True, 0, [0]), (False, 0, []), (True, 1, [])):
        skipped.clear()
        monkeypatch.setattr(entry, "group_torn_down", lambda torn_down=torn_down: torn_down)
        with pytest.raises(SystemExit) as left:
            entry.leave_cleanly(code)
        assert left.value.code == code and skipped == expected
