"""`ddpctl status/logs/pull/down RUN` from another directory than `up`'s, on the real test bed: the paths run.json
records (identity files, the known_hosts file) must not depend on the working directory, and -i must be used."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.testbed import Testbed, cleanup_stale
from tests.cli_runner import ddpctl
from tests.testbed_fixtures import TESTBED_SKIP_REASON, TESTBED_UNAVAILABLE

pytestmark = pytest.mark.skipif(TESTBED_UNAVAILABLE, reason=TESTBED_SKIP_REASON)
ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--gpus", "1", "--epochs", "1", "--synthetic-train-size", "1024", "--synthetic-test-size", "256"]


@pytest.fixture(scope="module")
def bed() -> Iterator[Testbed]:
    """One host on port 2222 with this machine's python and torch."""
    cleanup_stale("ddpra")
    testbed = Testbed("ddpra", n_hosts=1, ports=[2222], host_python=True)
    try:
        yield testbed
    finally:
        testbed.stop()


@pytest.fixture(scope="module")
def project(bed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run made in project/ with relative paths: `-i keys/id --runs-dir runs`, and
    DDPCTL_KNOWN_HOSTS=known_hosts."""
    project = tmp_path_factory.mktemp("project")
    (project / "keys").mkdir()
    shutil.copy(bed.client_key_path, project / "keys" / "id")
    shutil.copy(bed.known_hosts_path, project / "known_hosts")
    result = ddpctl("up", "--host", bed.hosts[0].spec, "-i", "keys/id", "--runs-dir", "runs", *SMALL,
                    cwd=project, known_hosts=Path("known_hosts"))
    assert result.returncode == 0, result.stderr
    return project


def the_run(project: Path) -> Path:
    (run,) = [p for p in (project / "runs").iterdir() if p.is_dir()]
    return run


def node_states(result: subprocess.CompletedProcess[str]) -> list[str]:
    assert result.returncode == 0, result.stderr
    return [n["state"] for n in json.loads(result.stdout)["nodes"]]


def host_torchrun_out(bed: Testbed, run: Path) -> Path:
    """The node's torchrun.out in its workspace on the host (whatever torch and torchrun printed: maybe nothing)."""
    return Path(bed.hosts[0].home, ".ddpctl", "runs", run.name, "torchrun.out")


def mark_host_output(bed: Testbed, run: Path, marker: str) -> str:
    """Append a line of our own to the node's torchrun.out on the host; its whole content after that."""
    out = host_torchrun_out(bed, run)
    with open(out, "a") as f:
        f.write(f"{marker}\n")
    return out.read_text()


def test_status_and_pull_by_absolute_path_from_another_directory(bed: Testbed, project: Path,
                                                                 tmp_path: Path) -> None:
    run = the_run(project)
    nowhere = tmp_path / "no_known_hosts"  # only the file `up` recorded can vouch for the host
    assert node_states(ddpctl("status", str(run), "--json", cwd=tmp_path, known_hosts=nowhere)) == ["finished"]
    on_host = mark_host_output(bed, run, "pulled by absolute path")
    (run / "nodes" / "0" / "torchrun.out").unlink()
    pulled = ddpctl("pull", str(run), cwd=tmp_path, known_hosts=nowhere)
    assert pulled.returncode == 0, pulled.stderr
    assert (run / "nodes" / "0" / "torchrun.out").read_text() == on_host  # the host's file, as it is there now
    assert not nowhere.exists()


def test_older_run_json_with_a_relative_known_hosts_path(bed: Testbed, project: Path, tmp_path: Path) -> None:
    """Older rented runs recorded runs/<id>/known_hosts, relative to `up`'s working directory."""
    run = shutil.copytree(the_run(project), tmp_path / "moved" / "runs" / the_run(project).name)
    shutil.copy(bed.known_hosts_path, run / "known_hosts")
    record = json.loads((run / "run.json").read_text())
    record["ssh"]["known_hosts_file"] = f"runs/{run.name}/known_hosts"
    record["hosts"][0]["identity_files"] = [bed.client_key_path]
    (run / "run.json").write_text(json.dumps(record))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    status = ddpctl("status", str(run), "--json", cwd=elsewhere, known_hosts=tmp_path / "no_known_hosts")
    assert node_states(status) == ["finished"]


def test_identity_file_option_serves_a_reattached_run(bed: Testbed, project: Path, tmp_path: Path) -> None:
    """The key `up` used moved away: -i names where it is now, for status, logs, pull and down."""
    run, recorded = the_run(project), project / "keys" / "id"
    mark_host_output(bed, run, "read with -i keys/id")
    (tmp_path / "keys").mkdir()
    moved = shutil.move(recorded, tmp_path / "keys" / "id")
    try:
        without = ddpctl("pull", str(run), cwd=tmp_path, known_hosts=project / "known_hosts")
        assert without.returncode == 1
        assert f"{recorded} (not found)" in without.stderr.strip().splitlines()[-1]
        assert node_states(ddpctl("status", str(run), "--json", cwd=tmp_path,
                                  known_hosts=project / "known_hosts")) == ["unreachable"]
        for command in (["status", "--json"], ["logs"], ["pull"], ["down"]):
            result = ddpctl(command[0], str(run), *command[1:], "-i", "keys/id", cwd=tmp_path,
                            known_hosts=project / "known_hosts")
            assert result.returncode == 0, f"{command}: {result.stderr}"
            if command[0] == "status":
                assert node_states(result) == ["finished"]
            if command[0] == "logs":
                assert result.stdout.splitlines()[-1] == "read with -i keys/id", "the end of the node's output"
    finally:
        shutil.move(moved, recorded)
