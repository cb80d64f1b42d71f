"""The files a Slurm job's run folder gets beside its batch script, sent as one tar on an SSH command's standard
input (launcher/places/slurm/job_files.py): which files, their modes, and that the tar holds them as they are."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from launcher.places.slurm.batch_script import SlurmJob, batch_script
from launcher.places.slurm.job_files import PLACE_AND_SUBMIT, PLACE_FAILED, job_files, tar_of
from launcher.places.slurm.scheduler import SlurmSubmit
from launcher.runtimes.join_files import join_hook_source
from launcher.spec.launchers import SPAWN_SCRIPT
from launcher.spec.run_spec import RunSpec
from launcher.spec.slurm_request import SlurmRequest
from launcher.spec.torchrun import TORCHRUN_SOURCE

RUN = "/scratch/u/ddpctl/runs/r1"


def submit(spec: RunSpec) -> SlurmSubmit:
    job = SlurmJob(spec, SlurmRequest(nodes=spec.nnodes), RUN, gpu_flag=None)
    return SlurmSubmit(job, batch_script(job), "/scratch/u/ddpctl", "login")


def test_our_trainer_gets_the_torchrun_wrapper_and_the_script() -> None:
    request = submit(RunSpec(run_id="r1", python="python3"))
    assert job_files(request) == [("torchrun_attempts.py", TORCHRUN_SOURCE.encode(), 0o644),
                                  ("job.sbatch", request.script.encode(), 0o644)]


def test_a_spawn_script_with_env_gets_its_values_owner_only_the_hook_and_spawn_sh() -> None:
    spec = RunSpec(run_id="r2", python="python3", launcher="spawn", user_command=("python", "t.py"),
                   extra_env=(("TOKEN", "s3cr3t"),))
    files = job_files(submit(spec))
    assert [(name, mode) for name, _, mode in files] == [
        ("torchrun_attempts.py", 0o644), ("ddpctl.env", 0o600), ("hook/sitecustomize.py", 0o644),
        ("spawn.sh", 0o644), ("job.sbatch", 0o644)]
    assert dict((n, d) for n, d, _ in files)["ddpctl.env"] == b"export TOKEN=s3cr3t\n"
    assert dict((n, d) for n, d, _ in files)["hook/sitecustomize.py"] == join_hook_source()
    assert dict((n, d) for n, d, _ in files)["spawn.sh"] == SPAWN_SCRIPT.encode()
    with tarfile.open(fileobj=io.BytesIO(tar_of(files))) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert members["hook"].isdir()
        assert {name: (members[name].mode, tar.extractfile(members[name]).read())  # type: ignore[union-attr]
                for name, _, _ in files} == {name: (mode, data) for name, data, mode in files}


def place_and_run(tmp_path: Path, *then: str) -> tuple[subprocess.CompletedProcess[bytes], Path]:
    """PLACE_AND_SUBMIT as the login node runs it, with `then` in sbatch's place: the code from a cache into a new
    run folder, the job's files from the tar on standard input."""
    cache, run = tmp_path / "cache", tmp_path / "runs" / "r1"
    cache.mkdir(exist_ok=True)
    (cache / "train.py").write_text("print(1)\n")
    tar = tar_of(job_files(submit(RunSpec(run_id="r1", python="python3"))))
    done = subprocess.run(["sh", "-c", PLACE_AND_SUBMIT, "ddpctl-submit", str(run), str(cache), "/trainer", *then],
                          input=tar, capture_output=True, timeout=30)
    return done, run


@pytest.mark.integration
def test_the_files_are_placed_then_submitted_with_the_login_shells_umask(tmp_path: Path) -> None:
    """sbatch hands its umask on to the job: the tar's owner-only umask stays with the tar."""
    script = tmp_path / "runs" / "r1" / "job.sbatch"
    done, run = place_and_run(tmp_path, "sh", "-c", 'umask; test -f "$0" && echo 42', str(script))
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().split() == [f"{os.umask(os.umask(0o22)):04o}", "42"]
    assert (run / "code" / "trainer" / "train.py").read_text() == "print(1)\n"
    assert sorted(p.name for p in run.iterdir()) == ["code", "job.sbatch", "torchrun_attempts.py"]


@pytest.mark.integration
def test_a_refused_submission_leaves_no_run_folder_and_keeps_its_status_and_reason(tmp_path: Path) -> None:
    done, run = place_and_run(tmp_path, "sh", "-c", "echo 'sbatch: error: QOSMaxJobsPerUserLimit' >&2; exit 1")
    assert (done.returncode, done.stderr.decode()) == (1, "sbatch: error: QOSMaxJobsPerUserLimit\n")
    assert not run.exists()


@pytest.mark.integration
def test_files_that_cannot_be_placed_are_told_apart_and_nothing_is_submitted(tmp_path: Path) -> None:
    (tmp_path / "runs").write_text("a file where the run's folder would go")
    done, _ = place_and_run(tmp_path, "touch", str(tmp_path / "submitted"))
    assert done.returncode == PLACE_FAILED and done.stderr
    assert not (tmp_path / "submitted").exists()
