"""The launcher as a laptop has it: no torch imported, GPUs counted without torch (nvidia-smi, narrowed by
CUDA_VISIBLE_DEVICES as CUDA reads it). A stand-in nvidia-smi on PATH plays a 2-GPU machine: no GPU here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import launcher
from launcher.execute.this_machine.run import visible_device_count
from tests.cli_runner import ddpctl_argv

REPO = Path(__file__).resolve().parents[1]

IMPORT_ALL = """
import pkgutil, sys, importlib
import launcher
from launcher.cli.app import app
names = [m.name for m in pkgutil.walk_packages(launcher.__path__, "launcher.") if m.name != "launcher.__main__"]
for name in names:
    importlib.import_module(name)
try:
    app(["up", "--help"], standalone_mode=False)
except BaseException as exc:  # click ends --help with an Exit exception
    pass
heavy = sorted(m for m in ("torch", "numpy", "torchvision") if m in sys.modules)
print(len(names), heavy)
"""


def test_importing_every_launcher_module_imports_no_torch() -> None:
    result = subprocess.run([sys.executable, "-c", IMPORT_ALL], capture_output=True, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert result.returncode == 0, result.stderr
    count, heavy = result.stdout.strip().splitlines()[-1].split(" ", 1)
    assert int(count) >= 40 and heavy == "[]", result.stdout
    assert Path(launcher.__file__).parent == REPO / "launcher"


@pytest.fixture
def two_gpu_machine(tmp_path: Path) -> dict[str, str]:
    """PATH with an nvidia-smi that lists two GPUs, as the real one prints them with -L."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0a)'\n"
                    "echo 'GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-1b)'\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def ddpctl(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # The whole environment is the test's (a PATH with a fake nvidia-smi, CUDA_VISIBLE_DEVICES set or not).
    return subprocess.run(ddpctl_argv(*args), capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


@pytest.mark.parametrize(("visible", "procs"), [(None, 2), ("1", 1), ("0,1", 2), ("", 2), ("1,7,0", 1)])
def test_default_processes_follow_the_visible_gpus(two_gpu_machine: dict[str, str], tmp_path: Path,
                                                   visible: str | None, procs: int) -> None:
    """One process per visible GPU; none visible (empty) means a CPU run of 2 processes."""
    env = dict(two_gpu_machine)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    result = ddpctl(env, tmp_path, "up", "--dry-run", "--epochs", "1")
    assert result.returncode == 0, result.stderr
    assert f"--nproc-per-node {procs} " in result.stdout
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("visible", "asked", "shown"), [(None, 3, 2), ("0", 2, 1)])
def test_more_gpus_than_visible_is_refused_in_one_line(two_gpu_machine: dict[str, str], tmp_path: Path,
                                                       visible: str | None, asked: int, shown: int) -> None:
    env = dict(two_gpu_machine)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    result = ddpctl(env, tmp_path, "up", "--gpus", str(asked), "--epochs", "1")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--gpus {asked} asks for more GPUs" in lines[0], result.stderr
    assert f"({shown}); use --gpus {shown} or less" in lines[0]
    assert not (tmp_path / "runs").exists()


def test_visible_device_count_reads_cuda_visible_devices_as_cuda_does() -> None:
    assert visible_device_count("0,1", 2) == 2
    assert visible_device_count("1", 2) == 1
    assert visible_device_count("", 2) == 0
    assert visible_device_count("-1", 2) == 0
    assert visible_device_count("0,5,1", 2) == 1  # entries after an invalid one are not seen
    assert visible_device_count("GPU-0a,GPU-1b", 2) == 2


def test_credentials_are_never_shipped_unless_re_included(tmp_path: Path) -> None:
    """`up -- CMD` ships the working directory, maybe to a stranger's rented machine: keys and tokens stay."""
    from launcher.transport.sync import ignore_spec, local_manifest

    files = ["train.py", "pkg/model.py", ".ssh/id_ed25519", "id_rsa.pub", "certs/server.pem", ".env",
             ".config/ddpctl/vast_api_key", ".config/vastai/vast_api_key", ".aws/credentials", ".netrc",
             ".venv/bin/python", "notes.txt"]
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    assert sorted(local_manifest(tmp_path, ignore_spec(tmp_path))) == ["notes.txt", "pkg/model.py", "train.py"]
    (tmp_path / ".ddpctlignore").write_text("!.env\n")  # the user's explicit choice
    assert ".env" in local_manifest(tmp_path, ignore_spec(tmp_path))


def test_shipping_the_home_directory_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO)}
    refused = ddpctl(env, home, "up", "--host", "u@10.0.0.1", "--dry-run", "--no-probe", "--", "python",
                  "train.py")
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        f"error: `-- CMD` ships the working directory to the hosts, and {home} is your home directory: "
        "cd into the project first"]
    (home / "project").mkdir()
    planned = ddpctl(env, home / "project", "up", "--host", "u@10.0.0.1", "--dry-run", "--no-probe", "--", "python",
                  "train.py")
    assert planned.returncode == 0, planned.stderr


def test_dry_run_json_is_the_plan_with_secrets_masked(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = ddpctl(env, tmp_path, "up", "--host", "u@10.0.0.1", "--host", "v@10.0.0.2", "--env", "TOKEN=s3cret",
                    "--dry-run", "--no-probe", "--json", "--epochs", "1")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["nnodes"] == 2 and [n["host"] for n in plan["nodes"]] == ["u@10.0.0.1", "v@10.0.0.2"]
    command = plan["nodes"][1]["command"]
    assert command[command.index("--rdzv-endpoint") + 1] == "10.0.0.1:29400"
    assert all(n["env"]["TOKEN"] == "***" for n in plan["nodes"]) and "s3cret" not in result.stdout + result.stderr
    # Not probed: the hosts' GPUs decide the process count (not the 1 shown), node 0 the port.
    assert [u.split(" (")[0].split(":")[0] for u in plan["unknown"]] == [
        "processes per node", "rendezvous port", "node addresses and network interfaces"]
    assert not (tmp_path / "runs").exists()


def test_up_help_groups_its_options_into_panels() -> None:
    result = subprocess.run([sys.executable, "-m", "launcher", "up", "--help-all"], capture_output=True, text=True,
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "160"}, timeout=120)
    assert result.returncode == 0, result.stderr
    panels = {}  # option -> the title of the panel it is listed in
    title = None
    for line in result.stdout.splitlines():
        if line.startswith("╭─ "):
            title = line.removeprefix("╭─ ").split(" ─")[0]
        elif line.startswith("│ --"):
            panels[line.split()[1]] = title
    assert panels["--epochs"] == panels["--model"] == "Run"
    assert panels["--host"] == panels["--identity-file"] == panels["--rdzv-port"] == "Hosts / SSH"
    assert panels["--image"] == panels["--registry"] == "Docker (--runtime docker)"
    assert panels["--gpu-name"] == panels["--max-cost"] == "Vast.ai (--provider vast)"
    assert panels["--json"] == panels["--dry-run"] == panels["--runs-dir"] == "Output"
    assert "[user@]host[:port]" in result.stdout  # brackets in help are shown, not taken as markup


LOCAL_PATH_IMPORTS = """
import sys
sys.modules["paramiko"] = None  # as on a GPU box with torch but no SSH library: importing it raises ImportError
sys.modules["docker"] = None
import launcher.execute.up, launcher.execute.this_machine.run, launcher.execute.this_machine.outputs, launcher.cli.app
print("ok")
"""


def test_a_local_run_needs_neither_paramiko_nor_the_docker_sdk() -> None:
    """A GPU machine with torch but without paramiko (the lent H100 has none) runs `ddpctl up` locally."""
    result = subprocess.run([sys.executable, "-c", LOCAL_PATH_IMPORTS], capture_output=True, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
