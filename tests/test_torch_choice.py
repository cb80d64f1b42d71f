"""Set-up's torch choice (infra/torch_choice.py): which build, from where, and the one line that says why."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.torch_choice import PYTORCH_INDEX, Driver, choose, parse_nvidia_smi, probe_index, wheel_tags

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = f"{PYTORCH_INDEX}/cpu"


class FakeIndex:
    """PyTorch's index as a dict: index URL -> versions it has; `down` makes every question go unanswered."""

    def __init__(self, has: dict[str, set[str]] | None = None, down: bool = False) -> None:
        self.has = has or {}
        self.down = down
        self.asked: list[tuple[str, str]] = []

    def __call__(self, index_url: str, version: str) -> bool | None:
        self.asked.append((index_url, version))
        return None if self.down else version in self.has.get(index_url, set())


def test_no_driver_gets_the_cpu_build_from_pytorchs_cpu_index() -> None:
    index = FakeIndex({CPU_INDEX: {"2.13.0+cpu"}})
    choice = choose("auto", "2.13.0", None, index)
    assert (choice.requirement, choice.index_url) == ("torch==2.13.0+cpu", CPU_INDEX)
    assert "CPU build" in choice.reason and "no NVIDIA driver" in choice.reason


def test_no_driver_and_index_unreachable_falls_back_to_pip_and_says_so() -> None:
    choice = choose("auto", "2.13.0", None, FakeIndex(down=True))
    assert (choice.requirement, choice.index_url) == ("torch==2.13.0", None)
    assert "did not answer" in choice.reason and "pip resolves" in choice.reason
    assert "\n" not in choice.reason


def test_driver_gets_the_newest_cuda_build_it_can_run() -> None:
    """nvidia-smi reports CUDA 12.6: cu130 and cu128 are too new for it, cu126 is the one."""
    index = FakeIndex({f"{PYTORCH_INDEX}/{tag}": {f"2.13.0+{tag}"} for tag in ("cu130", "cu128", "cu126", "cu118")})
    choice = choose("auto", "2.13.0", Driver(cuda=(12, 6)), index)
    assert (choice.requirement, choice.index_url) == ("torch==2.13.0+cu126", f"{PYTORCH_INDEX}/cu126")
    assert "CUDA 12.6" in choice.reason
    assert not any(url.endswith(("cu130", "cu129", "cu128")) for url, _ in index.asked)


def test_driver_skips_cuda_builds_the_index_lacks() -> None:
    index = FakeIndex({f"{PYTORCH_INDEX}/cu124": {"2.13.0+cu124"}})
    choice = choose("auto", "2.13.0", Driver(cuda=(12, 8)), index)
    assert choice.requirement == "torch==2.13.0+cu124"


def test_driver_and_index_unreachable_falls_back_to_pip() -> None:
    choice = choose("auto", "2.13.0", Driver(cuda=(13, 0)), FakeIndex(down=True))
    assert (choice.requirement, choice.index_url) == ("torch==2.13.0", None)
    assert "NVIDIA driver" in choice.reason and "did not answer" in choice.reason


def test_driver_too_old_for_every_build_says_so() -> None:
    index = FakeIndex({f"{PYTORCH_INDEX}/cu130": {"2.13.0+cu130"}})
    choice = choose("auto", "2.13.0", Driver(cuda=(11, 4)), index)
    assert choice.index_url is None and "newer driver" in choice.reason


def test_driver_without_a_reported_cuda_version_lets_pip_decide() -> None:
    choice = choose("auto", "2.13.0", Driver(cuda=None), FakeIndex({CPU_INDEX: {"2.13.0+cpu"}}))
    assert (choice.requirement, choice.index_url) == ("torch==2.13.0", None)
    assert "did not report" in choice.reason


def test_override_cpu_on_a_gpu_machine() -> None:
    index = FakeIndex({CPU_INDEX: {"2.13.0+cpu"}, f"{PYTORCH_INDEX}/cu126": {"2.13.0+cu126"}})
    choice = choose("cpu", "2.13.0", Driver(cuda=(12, 6)), index)
    assert choice.requirement == "torch==2.13.0+cpu" and "--torch cpu" in choice.reason


def test_override_cuda_on_a_cpu_machine_takes_the_newest_cuda_build() -> None:
    index = FakeIndex({f"{PYTORCH_INDEX}/{tag}": {f"2.13.0+{tag}"} for tag in ("cu130", "cu126")})
    choice = choose("cuda", "2.13.0", None, index)
    assert choice.requirement == "torch==2.13.0+cu130" and "--torch cuda" in choice.reason


def test_version_override_with_a_build_tag_uses_that_builds_index() -> None:
    index = FakeIndex({f"{PYTORCH_INDEX}/cu126": {"2.12.0+cu126"}})
    choice = choose("auto", "2.12.0+cu126", None, index)
    assert (choice.requirement, choice.index_url) == ("torch==2.12.0+cu126", f"{PYTORCH_INDEX}/cu126")


def test_parse_nvidia_smi_header() -> None:
    header = ("+-----------------------------------------------------------------------------------------+\n"
              "| NVIDIA-SMI 550.54.15              Driver Version: 550.54.15      CUDA Version: 12.4     |\n")
    assert parse_nvidia_smi(header) == (12, 4)
    assert parse_nvidia_smi("NVIDIA-SMI has failed because it couldn't communicate with the driver") is None


@pytest.fixture()
def simple_index(tmp_path: Path) -> Iterator[str]:
    """A real HTTP server holding a PEP 503 page for torch under cpu/ (links URL-quoted as PyTorch's are)."""
    python_tag, machine = wheel_tags()
    page = tmp_path / "cpu" / "torch" / "index.html"
    page.parent.mkdir(parents=True)
    wheel = f"torch-2.13.0%2Bcpu-{python_tag}-{python_tag}-manylinux_2_28_{machine}.whl"
    page.write_text(f'<html><body><a href="/whl/{wheel}#sha256=00">{wheel}</a></body></html>')
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path))  # noqa: E731
    http.server.SimpleHTTPRequestHandler.log_message = lambda *a: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_probe_reads_a_real_index(simple_index: str) -> None:
    assert probe_index(f"{simple_index}/cpu", "2.13.0+cpu") is True
    assert probe_index(f"{simple_index}/cpu", "2.12.0+cpu") is False
    assert probe_index(f"{simple_index}/cu126", "2.13.0+cu126") is False  # 404: it answered, without it


def test_probe_of_a_closed_port_is_no_answer() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connections are refused
        assert probe_index(f"http://127.0.0.1:{port}/whl/cpu", "2.13.0+cpu", timeout=5) is None


def run_choice(*args: str, path_dir: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "DDPCTL_TORCH_VERSION"}
    if path_dir is not None:
        full_env["PATH"] = f"{path_dir}{os.pathsep}{full_env['PATH']}"
    return subprocess.run([sys.executable, str(ROOT / "infra" / "torch_choice.py"), *args], capture_output=True,
                          text=True, timeout=60, env={**full_env, **env})


def test_script_prints_requirement_index_and_reason(simple_index: str) -> None:
    result = run_choice("--torch", "cpu", DDPCTL_PYTORCH_INDEX=simple_index)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["torch==2.13.0+cpu", f"{simple_index}/cpu",
                                          f"the CPU build (--torch cpu), from PyTorch's CPU index {simple_index}/cpu"]


def test_script_sees_a_driver_through_nvidia_smi(tmp_path: Path, simple_index: str) -> None:
    """An nvidia-smi on PATH reporting CUDA 12.6; the index has no CUDA build of 2.13.0, so pip decides."""
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho '| NVIDIA-SMI 560.35.03   Driver Version: 560.35.03   CUDA Version: 12.6 |'\n")
    smi.chmod(0o755)
    result = run_choice(path_dir=smi.parent, DDPCTL_PYTORCH_INDEX=simple_index)
    requirement, index, reason = result.stdout.splitlines()
    assert (requirement, index) == ("torch==2.13.0", "")
    assert "NVIDIA driver for CUDA 12.6" in reason and "newer driver" in reason


def test_script_refuses_a_malformed_version_in_one_line() -> None:
    result = run_choice(DDPCTL_TORCH_VERSION="latest")
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and "DDPCTL_TORCH_VERSION" in result.stderr
