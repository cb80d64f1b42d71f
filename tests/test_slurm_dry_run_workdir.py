"""`up --provider slurm --dry-run` is read-only on the cluster too: it makes no workdir on the login node (the run
makes it, when it places the job's files); a --workdir naming a variable the login node does not set is one line
(not a folder literally named `$NOPE_UNSET`); and `--no-probe` prints the script under the --workdir given."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from infra.slurm_cluster import SlurmCluster
from tests.cli_in_process import ddpctl_in_process
from tests.slurm_fixtures import needs_slurm
from tests.test_slurm_up import slurm_up_in_process
from tests.testbed_fixtures import run_ddpctl

SMALL = ("--synthetic-train-size", "256", "--synthetic-test-size", "64", "--epochs", "1")


def slurm_up(cluster: SlurmCluster, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return run_ddpctl(cluster.bed, "up", "--provider", "slurm", "--host", cluster.login.spec, *args, cwd=cwd,
                      timeout=timeout)


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.e2e
@needs_slurm
def test_the_dry_run_makes_no_workdir_and_the_run_makes_it(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    home = Path(slurm_cluster.login.home)
    before = tree(home)
    workdir = home / "fresh" / "deeper"
    dry = slurm_up(slurm_cluster, "--workdir", str(workdir), *SMALL, "--dry-run", cwd=tmp_path, timeout=120)
    assert dry.returncode == 0, dry.stderr
    assert f"#SBATCH --chdir={workdir}/runs/" in dry.stdout
    assert tree(home) == before and not (tmp_path / "runs").exists()  # nothing written, there or here

    # The job's files are placed before it is submitted: a held job (cancelled here, never run) shows it, without
    # a training run that nothing here looks at.
    up = slurm_up(slurm_cluster, "--workdir", str(workdir), *SMALL, "--sbatch-option", "--hold", "--detach",
                  cwd=tmp_path)
    records = [json.loads(p.read_text()).get("slurm") or {} for p in (tmp_path / "runs").glob("*/run.json")]
    for record in records:  # nothing left queued, whatever is asserted next
        if record.get("job_id"):
            slurm_cluster.slurm("scancel", str(record["job_id"]))
    assert up.returncode == 0, up.stderr
    [run] = (tmp_path / "runs").iterdir()
    assert [record.get("remote_dir") for record in records] == [f"{workdir}/runs/{run.name}"]
    assert (workdir / "runs" / run.name / "job.sbatch").is_file()


@pytest.mark.e2e
@needs_slurm
@pytest.mark.parametrize(("workdir", "named"), [
    ("$NOPE_UNSET", "$NOPE_UNSET is not set"),
    ("${NOPE_A}/exp/$NOPE_B", "$NOPE_A, $NOPE_B are not set"),
    ("$HOME/$NOPE_C/runs", "$NOPE_C is not set"),
])
@pytest.mark.parametrize("dry", [True, False])
def test_a_workdir_naming_an_unset_variable_is_one_line_and_makes_nothing(
        slurm_cluster: SlurmCluster, tmp_path: Path, workdir: str, named: str, dry: bool) -> None:
    home = Path(slurm_cluster.login.home)
    before = tree(home)
    up = slurm_up_in_process(slurm_cluster, "--workdir", workdir, *SMALL, *(("--dry-run",) if dry else ()),
                             cwd=tmp_path)
    assert up.returncode == 1
    (line,) = up.stderr.strip().splitlines()
    assert line == (f"error: --workdir {workdir}: {named} on the login node: give the folder's path, or name "
                    "variables set there (e.g. $HOME, $SCRATCH)")
    assert tree(home) == before and not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("workdir", "shown"), [
    ("/scratch/me/exp", "/scratch/me/exp"), ("$SCRATCH/exp", "$SCRATCH/exp"), ("~/exp", "$HOME/exp"),
    ("exp", "$HOME/exp"), (None, "$HOME/.ddpctl/slurm"),
])
def test_no_probe_prints_the_script_under_the_workdir_given(tmp_path: Path, workdir: str | None, shown: str) -> None:
    given = ("--workdir", workdir) if workdir else ()
    result = ddpctl_in_process("up", "--provider", "slurm", "--host", "u@10.9.9.1", *given, "--dry-run",
                               "--no-probe", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    run_id = result.stdout.split("# ddpctl run ")[1].split(":")[0]
    assert f"#SBATCH --chdir={shown}/runs/{run_id}\n" in result.stdout
    (sbatch_line,) = [line for line in result.stdout.splitlines() if line.startswith("# sbatch line: ")]
    assert sbatch_line.endswith(f"{shown}/runs/{run_id}/job.sbatch") or \
        sbatch_line.endswith(f"{shown}/runs/{run_id}/job.sbatch'")
    assert list(tmp_path.iterdir()) == []
