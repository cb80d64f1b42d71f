"""The shell scripts that run on the hosts (launcher/remote/*.sh): each is what the launcher sends (its file's text,
no second copy in the code), installed with the package, clean under shellcheck, and run here as a node runs it
(`sh -c TEXT NAME ARGS...`)."""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import launcher.remote
from launcher.places.slurm import mpi_job, node_progress, rank0_output, up
from launcher.places.vast import watchdog_state
from launcher.planning import mpi_check
from launcher.remote import shell_text
from launcher.runtimes import docker, docker_hosts
from launcher.spec import launchers

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

REMOTE = Path(launcher.remote.__file__).parent
ROOT = REMOTE.parent.parent
SENT = {  # file -> the text the launcher puts on the hosts' command lines
    "docker_run.sh": docker.RUN_SCRIPT,
    "docker_info.sh": docker_hosts.INFO_SCRIPT,
    "spawn.sh": launchers.SPAWN_SCRIPT,
    "mpirun.sh": launchers.MPIRUN_SCRIPT,
    "mpi_peer.sh": launchers.MPI_PEER_SCRIPT,
    "mpi_check.sh": mpi_check.MPI_CHECK_SCRIPT,
    "autostop_state.sh": watchdog_state.STATE_SCRIPT,
    "rank0_output.sh": rank0_output.RANK0_OUTPUT_SCRIPT,
    "slurm_progress.sh": up.PROGRESS_SCRIPT,
    "slurm_nodes.sh": node_progress.NODES_SCRIPT,
    "mpi_network.sh": mpi_job.NETWORK_SCRIPT,
}


def test_every_shell_script_is_sent_as_its_files_text() -> None:
    assert sorted(p.name for p in REMOTE.glob("*.sh")) == sorted(SENT)
    for name, sent in SENT.items():
        assert sent == (REMOTE / name).read_text(encoding="utf-8") == shell_text(name), name


def test_no_line_of_a_script_is_copied_into_the_code() -> None:
    """A script's working lines live in its file only (a copy in a string would drift from it)."""
    code = {p: p.read_text(encoding="utf-8") for p in sorted((ROOT / "launcher").rglob("*.py"))}
    for name in SENT:
        for line in (REMOTE / name).read_text(encoding="utf-8").splitlines():
            line = line.strip()
            if len(line) >= 25 and not line.startswith("#"):
                assert not [str(p) for p, text in code.items() if line in text], (name, line)


def test_the_scripts_are_installed_with_the_package() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    patterns = config["package-data"]["launcher.remote"]
    assert all(any(fnmatch.fnmatch(name, pattern) for pattern in patterns) for name in SENT)


def sh(script: str, name: str, *args: str, env: dict[str, str] | None = None,
       cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", script, name, *args], capture_output=True, text=True, timeout=60,
                          env=env, cwd=cwd)


@pytest.mark.integration
def test_shellcheck_finds_nothing_in_any_script() -> None:
    assert shutil.which("shellcheck"), "shellcheck is missing: `bash infra/setup.sh --test` installs it"
    for path in sorted(REMOTE.glob("*.sh")):
        assert path.read_text(encoding="utf-8").startswith("# shellcheck shell=sh\n"), path.name
    result = subprocess.run(["shellcheck", *sorted(str(p) for p in REMOTE.glob("*.sh"))], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.integration
def test_a_spawn_node_runs_its_command_once_into_the_log_layout_with_a_free_port(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "DDPCTL_NNODES")}
    show = 'echo "$MASTER_ADDR $MASTER_PORT $DDPCTL_MASTER_ADDR $DDPCTL_MASTER_PORT"; echo oops >&2; exit "$1"'
    done = sh(launchers.SPAWN_SCRIPT, "ddpctl-spawn", str(tmp_path / "logs"), sys.executable, "sh", "-c", show, "s",
              "0", env=env)
    out = tmp_path / "logs" / "spawn" / "attempt_0" / "0"
    assert done.returncode == 0 and done.stdout == "" and done.stderr == ""
    addr, port, dd_addr, dd_port = (out / "stdout.log").read_text().split()
    assert addr == dd_addr == "127.0.0.1" and port == dd_port and 0 < int(port) < 65536
    assert (out / "stderr.log").read_text() == "oops\n"
    failed = sh(launchers.SPAWN_SCRIPT, "ddpctl-spawn", str(tmp_path / "logs"), sys.executable, "sh", "-c", show,
                "s", "7", env={**env, "MASTER_PORT": "1234", "DDPCTL_NNODES": "1"})
    assert failed.returncode == 7 and failed.stderr == "oops\n"  # how it ended, for the failure line
    assert (out / "stdout.log").read_text().split()[1] == "1234"  # the user's own port is kept
    several = sh(launchers.SPAWN_SCRIPT, "ddpctl-spawn", str(tmp_path / "logs"), "/nonexistent/python", "sh", "-c",
                 show, "s", "0", env={**env, "DDPCTL_NNODES": "2"})
    assert several.returncode == 0 and (out / "stdout.log").read_text() == "   \n"  # node 0's address: from ddpctl


@pytest.mark.integration
def test_the_mpirun_node_runs_mpirun_into_the_log_layout(tmp_path: Path) -> None:
    done = sh(launchers.MPIRUN_SCRIPT, "ddpctl-mpirun", str(tmp_path / "logs"), "echo", "-np", "2", "python3")
    out = tmp_path / "logs" / "mpirun" / "attempt_0" / "0"
    root = ["--allow-run-as-root"] if os.getuid() == 0 else []
    assert done.returncode == 0 and (out / "stdout.log").read_text().split() == [*root, "-np", "2", "python3"]
    failing = tmp_path / "failing-mpirun"
    failing.write_text('#!/bin/sh\necho "$@"; echo bad >&2; exit 3\n')
    failing.chmod(0o755)
    failed = sh(launchers.MPIRUN_SCRIPT, "ddpctl-mpirun", str(tmp_path / "logs"), str(failing), "-np", "1")
    assert failed.returncode == 3 and failed.stderr == "bad\n"  # how it ended, for the failure line
    # A rank's traceback, then more of the launcher's own lines than a tail holds (srun's): the traceback is told.
    noisy = tmp_path / "noisy-srun"
    notes = "".join(f"srun: error: task {k}: Killed\n" for k in range(30))
    noisy.write_text(f"#!/bin/sh\ncat >&2 <<'EOF'\nTraceback (most recent call last):\n  File \"x.py\", line 1\n"
                     f"    boom()\nRuntimeError: rank 3 gives up\n--------\n{notes}EOF\nexit 1\n")
    noisy.chmod(0o755)
    told = sh(launchers.MPIRUN_SCRIPT, "ddpctl-mpirun", str(tmp_path / "logs"), str(noisy))
    assert told.returncode == 1 and told.stderr == ('Traceback (most recent call last):\n  File "x.py", line 1\n'
                                                    "    boom()\nRuntimeError: rank 3 gives up\n")
    peer = sh(launchers.MPI_PEER_SCRIPT, "ddpctl-mpi-node", "1", "4")
    assert peer.stdout == "node 1: its 4 process(es) are started by node 0's mpirun over SSH\n"


@pytest.mark.integration
def test_the_mpi_check_names_what_a_host_lacks(tmp_path: Path) -> None:
    assert sh(mpi_check.MPI_CHECK_SCRIPT, "c", sys.executable, "1", "1").stdout == "\n"  # this machine has it all
    lacking = sh(mpi_check.MPI_CHECK_SCRIPT, "c", "/nonexistent/python", "1", "0").stdout
    assert mpi_check.missing_line(lacking) == (
        "--launcher mpirun needs mpi4py (/nonexistent/python cannot import it: /nonexistent/python -m pip install "
        "mpi4py, or install python3-mpi4py)")
    bare = tmp_path / "bin"  # a PATH with neither mpirun nor ssh
    bare.mkdir()
    for tool in ("grep",):
        (bare / tool).symlink_to(shutil.which(tool) or tool)
    found = subprocess.run(["/bin/sh", "-c", mpi_check.MPI_CHECK_SCRIPT, "c", sys.executable, "0", "1"],
                           capture_output=True, text=True, timeout=60, env={"PATH": str(bare)}).stdout
    assert mpi_check.missing_line(found) == (
        "--launcher mpirun needs openmpi (no mpirun on PATH: install openmpi-bin), ssh (node 0 starts the other "
        "nodes' processes over SSH: install openssh-client)")


@pytest.mark.integration
def test_the_docker_info_of_a_host_without_docker_names_the_problem(tmp_path: Path) -> None:
    found = subprocess.run(["/bin/sh", "-c", docker_hosts.INFO_SCRIPT, "i", "img"], capture_output=True, text=True,
                           timeout=60, env={"PATH": str(tmp_path)})
    assert found.returncode == 0 and found.stdout == "problem no docker command on this host\n"


@pytest.mark.integration
def test_rank0_output_reads_the_newest_attempt_of_the_node_that_writes_progress(tmp_path: Path) -> None:
    """A Slurm run's folder on the shared file system: rank 0's node found by its progress.json (or given), the
    newest attempt's stdout from the offset already shown, at most the bytes asked, a restart starting over."""
    def log(node: int, attempt: int, text: str) -> None:
        path = tmp_path / "nodes" / str(node) / "logs" / "job-7" / f"attempt_{attempt}" / "0" / "stdout.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def read(node: int, offset: int, attempt: str, most: int = 65536) -> str:
        done = sh(rank0_output.RANK0_OUTPUT_SCRIPT, "ddpctl-rank0", str(tmp_path), "2", "0", str(node), "0",
                  str(offset), attempt, str(most))
        assert done.returncode == 0 and done.stderr == "", done.stderr
        return done.stdout

    assert read(-1, 0, "-") == "NODE 0 ATTEMPT - SIZE 0 START 0 BY name\n"  # nothing written yet
    log(0, 0, "node 0 line\n")
    log(1, 0, "first\n")
    (tmp_path / "nodes" / "1" / "out").mkdir(parents=True)
    (tmp_path / "nodes" / "1" / "out" / "progress.json").write_text("{}")
    assert read(-1, 0, "-") == "NODE 1 ATTEMPT 0 SIZE 6 START 0 BY progress\nfirst\n"
    log(1, 0, "first\nsecond\n")
    assert read(1, 6, "0") == "NODE 1 ATTEMPT 0 SIZE 13 START 6 BY given\nsecond\n"  # only what is new
    assert read(1, 0, "-", most=4) == "NODE 1 ATTEMPT 0 SIZE 13 START 9 BY given\nond\n"  # the last bytes only
    log(1, 10, "after the restart\n")  # attempt 10 is newer than 0..9 (numbers, not text)
    log(1, 9, "older\n")
    assert read(1, 13, "0") == "NODE 1 ATTEMPT 10 SIZE 18 START 0 BY given\nafter the restart\n"


@pytest.mark.integration
def test_the_slurm_followers_read_each_nodes_progress_exit_and_newest_attempt(tmp_path: Path) -> None:
    """A Slurm run's folder on the shared file system, as `up` follows it and `status` reads it: node 0 wrote its
    progress and restarted (attempts 0..10), node 1 ended (exit 1) with no progress; node 2 has not started."""
    for attempt in (0, 2, 10, 9):
        (tmp_path / "nodes" / "0" / "logs" / "job-7" / f"attempt_{attempt}").mkdir(parents=True)
    (tmp_path / "nodes" / "0" / "out").mkdir(parents=True)
    (tmp_path / "nodes" / "0" / "out" / "progress.json").write_text('{"epoch": 2}')
    (tmp_path / "nodes" / "1").mkdir(parents=True)
    (tmp_path / "nodes" / "1" / "exit_code").write_text("1\n")
    done = sh(node_progress.NODES_SCRIPT, "ddpctl-nodes", str(tmp_path), "3")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout == 'NODE 0|| 0 10 2 9\n{"epoch": 2}\nNODE 1|1|\n\nNODE 2||\n\n'
    here = SimpleNamespace(run=lambda argv, timeout: SimpleNamespace(stdout=sh(*argv[2:]).stdout))
    assert node_progress.node_states(here, str(tmp_path), 3) == [  # type: ignore[arg-type]
        (None, {"epoch": 2}, 10), (1, {}, None), (None, {}, None)]  # attempt 10 is the newest: numbers, not text
    done = sh(up.PROGRESS_SCRIPT, "ddpctl-progress", str(tmp_path))
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout == f'NODE {tmp_path}/nodes/0/out/progress.json\n{{"epoch": 2}}\n'
