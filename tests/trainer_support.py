"""Helpers for the trainer tests: run `python -m trainer` alone or under a real torchrun, read its outputs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from launcher.remote.proctree import stop_tree

REPO = Path(__file__).resolve().parents[1]

# Small enough for seconds per run on 2 shared cores, large enough that a 2-process run learns in 2 epochs.
# 4095 is odd so DistributedSampler's padding shows (2 x 2048 samples per epoch).
SMALL_RUN = [
    "--epochs", "2", "--synthetic-train-size", "4095", "--synthetic-test-size", "512",
    "--lr", "0.05", "--seed", "3", "--save-every", "1",
]  # fmt: skip


def torchvision_importable() -> bool:
    try:
        import torchvision  # noqa: F401
    except Exception:  # built for another torch: RuntimeError, not ImportError
        return False
    return True


def start_command(argv: list[str], env: dict[str, str | None] | None = None) -> subprocess.Popen[str]:
    """Start argv from the repo root in its own session (so finish_command can kill its whole group);
    `env` adds variables to ours, or removes those given as None."""
    merged = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    for key, value in (env or {}).items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return subprocess.Popen(
        argv, cwd=REPO, env=merged, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def finish_command(proc: subprocess.Popen[str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """Wait for a start_command process; on timeout kill its whole group (torchrun's workers too)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_tree(proc.pid, 0)  # torchrun's workers sit in sessions of their own
        out, err = proc.communicate()
        raise AssertionError(f"{proc.args} ran over {timeout}s\nstdout:\n{out}\nstderr:\n{err}") from None
    finally:
        if proc.poll() is None:
            stop_tree(proc.pid, 0)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_command(argv: list[str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """Run argv from the repo root; on timeout kill the whole group (torchrun's workers too)."""
    return finish_command(start_command(argv), timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_trainer(args: list[str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """`python -m trainer ARGS` without torchrun: a world of one."""
    return run_command([sys.executable, "-m", "trainer", *args], timeout)


def run_torchrun(
    args: list[str], nproc: int = 2, max_restarts: int = 0, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """`python -m torch.distributed.run --standalone ... -m trainer ARGS`, gloo on CPU."""
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
        "--nproc-per-node", str(nproc), "--max-restarts", str(max_restarts), "-m", "trainer", *args,
    ]  # fmt: skip
    return run_command(argv, timeout)


def read_timing(out_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out_dir / "timing.jsonl").read_text().splitlines() if line.strip()]


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    different = [name for name in a if not torch.equal(a[name], b[name])]
    assert not different, f"weights differ: {different}"


def describe(result: subprocess.CompletedProcess[str]) -> str:
    return f"rc={result.returncode}\nstdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-6000:]}"
