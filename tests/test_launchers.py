"""`--launcher` on this machine: spawn scripts run once and train with their own processes, the summary's world
size is the one that ran (measured from the processes' joins), and scripts that would start processes or MPI
worlds ddpctl did not plan are refused before the run or caught after it (tests/launcher_scripts.py: the shapes).
Runs start ddpctl as a process; refusals and dry runs call its main() here (`ddpctl_here`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from launcher.errors import SpecError
from launcher.results.joined_worlds import JoinRecord, MeasuredWorlds, world_verdict
from launcher.spec.launchers import check_script
from launcher.spec.run_spec import RunSpec
from launcher.spec.script_look import look
from tests import cli_runner
from tests.cli_in_process import ddpctl_in_process
from tests.launcher_scripts import write_scripts

REPO = Path(__file__).resolve().parent.parent


def ddpctl(project: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return cli_runner.ddpctl(*args, cwd=project, timeout=timeout)


def ddpctl_here(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A refusal or a dry run: ddpctl's main() in this process (nothing here is about a process boundary)."""
    return ddpctl_in_process(*args, cwd=project)


def only_run(runs: Path) -> Path:
    (run,) = [p for p in runs.iterdir() if p.is_dir()]
    return run


# spawn_localhost.py meets at localhost:12355 as the write-ups have it: its runs go one at a time on one worker.
SCRIPT_PORT = pytest.mark.xdist_group("localhost_port_12355")


def joins(run: Path) -> list[dict[str, object]]:
    return [json.loads(p.read_text()) for p in sorted((run / "logs" / "joined").glob("*.json"))]


@pytest.mark.integration
@SCRIPT_PORT
def test_a_spawn_script_runs_once_and_its_own_processes_train(tmp_path: Path) -> None:
    """Write-ups 2 and 4 as written (localhost:12355, world_size = 2 in the script), with --gpus 1: the summary
    says world size 2 and 2 processes, what ran (before, torchrun's layout said 1)."""
    project = write_scripts(tmp_path / "project")
    result = ddpctl(project, "up", "--launcher", "spawn", "--gpus", "1", "--runs-dir", "runs", "--json",
                    "--", "python", "spawn_localhost.py")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["summary"]["world_size"] == 2 and out["summary"]["processes"] == 2
    assert out["summary"]["world_measured"] is True and out["summary"]["launcher"] == "spawn"
    run = only_run(project / "runs")
    log = (run / "logs" / "spawn" / "attempt_0" / "0" / "stdout.log").read_text()
    for rank in (0, 1):  # both spawned processes trained, in one world of 2
        assert f"rank {rank}/2 step 19 loss" in log and f"rank {rank} done" in log
    assert sorted((j["rank"], j["world_size"], j["where"]) for j in joins(run)) == [
        (0, 2, "localhost:12355"), (1, 2, "localhost:12355")]
    assert (run / "out" / "model.pt").stat().st_size > 0
    plan = run.joinpath("run.json").read_text()
    assert '"launcher": "spawn"' in plan


@pytest.mark.integration
def test_a_spawn_script_is_told_its_place_by_ddpctls_variables(tmp_path: Path) -> None:
    """The multi-node shape on one node: DDPCTL_NODE_RANK 0, NNODES 1, NPROC_PER_NODE from --gpus, and node 0's
    address and a free port (MASTER_ADDR/MASTER_PORT too); shown by --dry-run."""
    project = write_scripts(tmp_path / "project")
    dry = ddpctl_here(project, "up", "--launcher", "spawn", "--gpus", "3", "--dry-run", "--", "python",
                      "spawn_ddpctl.py")
    assert dry.returncode == 0, dry.stderr
    assert "launcher spawn" in dry.stdout and "DDPCTL_NPROC_PER_NODE=3" in dry.stdout
    assert "torch.distributed.run" not in dry.stdout and "once on this node (--launcher spawn)" in dry.stdout
    result = ddpctl(project, "up", "--launcher", "spawn", "--gpus", "3", "--runs-dir", "runs", "--json",
                    "--", "python", "spawn_ddpctl.py")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["summary"]["world_size"] == 3
    records = joins(only_run(project / "runs"))
    assert sorted(j["rank"] for j in records) == [0, 1, 2] and {j["node"] for j in records} == {"0"}
    where = {j["where"] for j in records}
    assert len(where) == 1 and where.pop().startswith("127.0.0.1:")  # the port ddpctl picked, not 29400


@pytest.mark.integration
def test_a_spawn_script_under_torchrun_is_refused_naming_the_line_and_the_launcher(tmp_path: Path) -> None:
    project = write_scripts(tmp_path / "project")
    result = ddpctl_here(project, "up", "--runs-dir", "runs", "--", "python", "spawn_localhost.py")
    assert result.returncode == 1 and result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: spawn_localhost.py:") and "mp.spawn(main" in line and "--launcher spawn" in line
    assert not (project / "runs").exists()


@pytest.mark.integration
@SCRIPT_PORT
def test_chosen_torchrun_with_a_spawn_script_warns_before_and_fails_after_with_the_measured_world(
        tmp_path: Path) -> None:
    """The issue's `--gpus 1` case, with torchrun chosen outright: a warning first, then the world that ran (2
    processes, more than the planned 1) fails the run in one line naming both worlds and `--launcher spawn`."""
    project = write_scripts(tmp_path / "project")
    result = ddpctl(project, "up", "--launcher", "torchrun", "--gpus", "1", "--runs-dir", "runs",
                    "--", "python", "spawn_localhost.py")
    assert result.returncode == 1, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, result.stderr
    assert "starts its own processes" in warnings[0] and "--launcher spawn" in warnings[0]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the world that ran has 2 processes, more than the planned 1"), last
    assert "`--launcher spawn`" in last
    summary = json.loads((only_run(project / "runs") / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["processes"] == 2 and summary["world_failed"] is True


@pytest.mark.integration
def test_an_mpi_script_as_torchrun_workers_fails_as_separate_worlds(tmp_path: Path) -> None:
    """`-- python parallel_sgd.py` under torchrun (chosen outright): each worker is an MPI world of one; the run
    exits 1 naming the separate worlds, never 0 with "world size 2"."""
    pytest.importorskip("mpi4py", reason="mpi4py (infra/setup.sh --test installs it)")
    project = write_scripts(tmp_path / "project")
    result = ddpctl(project, "up", "--launcher", "torchrun", "--gpus", "2", "--runs-dir", "runs",
                    "--", "python", "parallel_sgd.py")
    assert result.returncode == 1, result.stderr
    assert "an MPI script" in result.stderr.splitlines()[0]
    summary = json.loads((only_run(project / "runs") / "summary.json").read_text())
    # Two MPI singletons started at once sometimes abort in OpenMPI's start-up ("Local abort before MPI_INIT"):
    # then the run fails on its own; when both ran, the measured worlds fail it.
    if (only_run(project / "runs") / "logs" / "joined").is_dir():
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("error: the run did not train as one world: 2 process(es) in 2 separate worlds"), last
        assert summary["world_size"] is None and summary["worlds"] == 2 and summary["world_failed"] is True
    assert summary["world_size"] != 2


@pytest.mark.integration
@pytest.mark.parametrize("command", [["mpiexec", "-np", "2", "python", "parallel_sgd.py"],
                                     ["mpirun", "--allow-run-as-root", "-n", "2", "python3", "parallel_sgd.py"],
                                     ["/usr/bin/mpiexec.openmpi", "python", "parallel_sgd.py"]])
def test_mpi_launchers_after_the_dash_dash_are_refused(tmp_path: Path, command: list[str]) -> None:
    project = write_scripts(tmp_path / "project")
    result = ddpctl_here(project, "up", "--runs-dir", "runs", "--", *command)
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: `-- {Path(command[0]).name} ...` would start a whole MPI job"), line
    assert "--launcher mpirun" in line
    assert not (project / "runs").exists()


@pytest.mark.integration
def test_an_mpi_script_is_refused_under_torchrun_and_spawn(tmp_path: Path) -> None:
    project = write_scripts(tmp_path / "project")
    for launcher in ("torchrun", "spawn"):
        result = ddpctl_here(project, "up", "--dry-run", *(["--launcher", launcher] if launcher == "spawn" else []),
                        "--", "python", "parallel_sgd.py")
        assert result.returncode == 1
        assert "parallel_sgd.py:3: `from mpi4py import MPI`: an MPI script" in result.stderr
        assert "--launcher mpirun" in result.stderr


@pytest.mark.integration
@pytest.mark.parametrize(("args", "message"), [
    (["--launcher", "spawn"], "--launcher spawn starts your own script"),
    (["--launcher", "spawn", "--max-restarts", "1", "--", "python", "x.py"], "--max-restarts is torchrun's"),
    (["--launcher", "mpi", "--", "python", "x.py"], "--launcher 'mpi': choose one of torchrun, spawn, mpirun"),
])
def test_launcher_bad_input_is_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    project = write_scripts(tmp_path / "project")
    result = ddpctl_here(project, "up", "--runs-dir", "runs", *args)
    assert result.returncode != 0 and message in result.stderr
    assert not (project / "runs").exists()


def test_the_static_look_finds_spawn_mpi_and_a_pinned_localhost(tmp_path: Path) -> None:
    project = write_scripts(tmp_path / "project")
    kinds = {f.kind: f.line_number for f in look(("python", "spawn_localhost.py"), project)}
    assert set(kinds) == {"spawns", "localhost"}
    assert {f.kind for f in look(("python3", "-u", "parallel_sgd.py", "--x"), project)} == {"mpi"}
    assert look(("python", "-m", "pkg.train"), project) == []  # nothing to read: no claim either way
    assert {f.kind for f in look(("python", "spawn_hidden.py"), project)} == {"spawns"}  # its import is not read
    with pytest.raises(SpecError, match=r"spawn_localhost.py:\d+: `os.environ\[\"MASTER_ADDR\"\] = \"localhost\"` "
                                        r"pins the process group to this machine: on 2 nodes"):
        check_script(look(("python", "spawn_localhost.py"), project), "spawn", explicit=True, nnodes=2,
                     nproc_per_node=2)
    assert check_script(look(("python", "spawn_ddpctl.py"), project), "spawn", explicit=True, nnodes=2,
                        nproc_per_node=2) == []


def _record(rank: int, size: int, node: int) -> JoinRecord:
    return JoinRecord("torch", rank, size, node, "h", 0, "localhost:12355")


def test_the_verdict_fails_separate_worlds_and_a_world_short_of_the_nodes() -> None:
    two = MeasuredWorlds(tuple(_record(r, 2, n) for n in (0, 1) for r in (0, 1)))
    fields, warning, failed = world_verdict(two, planned_nodes=2, planned_world=2)
    assert failed and fields["world_size"] is None and fields["processes"] == 4 and fields["worlds"] == 2
    assert warning is not None and "4 process(es) in 2 separate worlds (world size 2) on nodes 0, 1" in warning
    one_node = MeasuredWorlds((_record(0, 2, 0), _record(1, 2, 0)))
    assert world_verdict(one_node, planned_nodes=2, planned_world=None)[2] is True
    assert world_verdict(one_node, planned_nodes=1, planned_world=2) == (
        {"world_size": 2, "processes": 2, "worlds": 1, "world_measured": True}, None, False)
    assert world_verdict(None, planned_nodes=1, planned_world=2) == (
        {"world_size": None, "processes": None, "world_measured": False}, None, False)


@pytest.mark.integration
def test_an_mpi4py_script_runs_as_one_mpi_world_with_launcher_mpirun(tmp_path: Path) -> None:
    """Write-up 5's parallel SGD (bcast/scatter/gather) as one MPI job of --gpus processes; here ddpctl runs as
    root, which mpirun refuses unless told: ddpctl tells it (--allow-run-as-root), no banner as the outcome."""
    pytest.importorskip("mpi4py", reason="mpi4py (infra/setup.sh --test installs it)")
    project = write_scripts(tmp_path / "project")
    dry = ddpctl_here(project, "up", "--launcher", "mpirun", "--gpus", "2", "--dry-run", "--", "python",
                      "parallel_sgd.py")
    assert dry.returncode == 0 and "mpirun -np 2 --host localhost:2 --bind-to none " in dry.stdout
    assert " -m mpi4py parallel_sgd.py" in dry.stdout, dry.stderr
    result = ddpctl(project, "up", "--launcher", "mpirun", "--gpus", "2", "--runs-dir", "runs", "--json",
                    "--", "python", "parallel_sgd.py")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)["summary"]
    assert summary["world_size"] == 2 and summary["processes"] == 2 and summary["launcher"] == "mpirun"
    run = only_run(project / "runs")
    assert sorted((j["kind"], j["rank"], j["world_size"]) for j in joins(run)) == [("mpi", 0, 2), ("mpi", 1, 2)]
    log = (run / "logs" / "mpirun" / "attempt_0" / "0" / "stdout.log").read_text()
    assert "rank 0/2 epoch 3/3 loss" in log and "rank 1/2 epoch 3/3 loss" in log and "rank 1 done" in log


@pytest.mark.integration
def test_a_python_without_mpi4py_is_named_in_one_line(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    project = write_scripts(tmp_path / "project")
    result = ddpctl_here(project, "up", "--launcher", "mpirun", "--python", str(venv / "bin" / "python"), "--runs-dir",
                    "runs", "--", "python", "parallel_sgd.py")
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: this machine: --launcher mpirun needs mpi4py (") and "pip install mpi4py" in line
    assert not (project / "runs").exists()


class _PinnedKey:
    def get_name(self) -> str:
        return "ssh-ed25519"

    def get_base64(self) -> str:
        return "AAAAC3NzaC1lZDI1NTE5AAAAIPinnedKeyOfNodeOne"


class _Session:
    """The two things MpiAccess reads of a session for its files: each host's target and verified key."""

    targets = [SimpleNamespace(hostname="10.9.0.2", port=22, user="alice"),
               SimpleNamespace(hostname="gpu2.example", port=2222, user="bob")]

    def conn(self, index: int) -> SimpleNamespace:
        return SimpleNamespace(transport=SimpleNamespace(get_remote_server_key=_PinnedKey))


def test_node_0s_ssh_files_pin_the_verified_host_key_and_trust_nothing_new(tmp_path: Path) -> None:
    from launcher.execute.hosts.mpi_access import MpiAccess
    from launcher.planning.plan import NodeHost, NodePlan, RunPlan

    spec = RunSpec(run_id="mpi-1", nnodes=2, nproc_per_node=2, user_command=("python3", "x.py"), launcher="mpirun")
    nodes = tuple(NodePlan(i, NodeHost(f"h{i}", f"10.9.0.{i + 2}", "eth0"), "native", ".ddpctl/runs/mpi-1", (), (),
                           "") for i in range(2))
    access = MpiAccess(_Session(), RunPlan(spec, nodes), run_dir=None)  # type: ignore[arg-type]
    config = access._ssh_config("/home/alice/.ddpctl/runs/mpi-1/mpi")
    assert "Host ddpctl-node-1\n  HostName 10.9.0.3\n  Port 2222\n  User bob\n" in config
    assert "  HostKeyAlias ddpctl-node-1\n  StrictHostKeyChecking yes\n  BatchMode yes\n" in config
    known = "/home/alice/.ddpctl/runs/mpi-1/mpi/known_hosts"
    assert f"UserKnownHostsFile {known}\n  GlobalKnownHostsFile /dev/null" in config
    assert "StrictHostKeyChecking no" not in config and "accept-new" not in config
    assert access._known_hosts() == "ddpctl-node-1 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPinnedKeyOfNodeOne\n"


@pytest.mark.integration
def test_a_spawn_script_that_raises_fails_with_its_exception_not_torchruns_name(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "gives_up.py").write_text(
        "import torch.multiprocessing as mp\n\n\ndef main(rank):\n    print(f'rank {rank} done', flush=True)\n"
        "    if rank == 1:\n        raise ValueError('rank 1 cannot go on')\n\n\n"
        "if __name__ == '__main__':\n    mp.spawn(main, nprocs=2)\n")
    result = ddpctl(project, "up", "--launcher", "spawn", "--runs-dir", "runs", "--", "python", "gives_up.py")
    assert result.returncode == 1
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert error.startswith("error: training failed: the script on node 0 (local) exited with 1: "
                            "ValueError: rank 1 cannot go on"), result.stderr
