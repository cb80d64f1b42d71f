"""The files a Slurm job's run folder gets beside its batch script, sent as one tar on an SSH command's standard
input (launcher/places/slurm/job_files.py): which files, their modes, and that the tar holds them as they are."""

from __future__ import annotations

import io
import tarfile

from launcher.places.slurm.batch_script import SlurmJob, batch_script
from launcher.places.slurm.job_files import job_files, tar_of
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
