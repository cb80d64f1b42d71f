"""The files of a Slurm job's run folder, put on the shared file system in one SSH command before `sbatch`: the code
copied from the workdir's cache, then one tar stream on the command's standard input holding the batch script and
what it reads beside it (torchrun's attempt wrapper; --env's values, mode 0600; a `-- CMD` job's join hook;
spawn.sh). Values arrive on standard input, never on a command line; one round trip, where a file each cost one.
The same command submits the script once it is in place (`place_and_submit`): the files and sbatch are one round
trip, and a script Slurm refuses leaves no run folder behind."""

from __future__ import annotations

import io
import tarfile

from launcher.errors import HostError
from launcher.places.slurm.batch_script import ENV_FILE, SCRIPT_NAME, SPAWN_FILE, TORCHRUN_FILE, env_file_text
from launcher.places.slurm.mpi_job import MPIRUN_FILE
from launcher.places.slurm.scheduler import SlurmSubmit
from launcher.runtimes.join_files import HOOK_FILE, join_hook_source
from launcher.spec.launchers import HOOK_DIR, MPIRUN_SCRIPT, SPAWN_SCRIPT
from launcher.spec.torchrun import TORCHRUN_SOURCE
from launcher.transport.ssh import CommandResult, Connection

# $1 the run's folder, $2 the code's cache, $3 where under code/ it goes. The tar is unpacked with umask 077, so no
# file is readable by others at any moment (the archive's own modes are applied as it is unpacked).
PLACE = ('mkdir -p "$1/code$3" && rm -rf "$1/code$3" && cp -R "$2" "$1/code$3" && '
         'umask 077 && tar -xf - -C "$1" --no-same-owner')
# PLACE (in a subshell: sbatch hands its umask on to the job), then the rest of the arguments (sbatch's line). A
# placement that fails exits PLACE_FAILED before anything is submitted; sbatch's refusal removes the run's folder
# (nothing of the run stays on the cluster) and exits with sbatch's status, its reason on stderr.
PLACE_FAILED = 90
PLACE_AND_SUBMIT = ('run=$1\n'
                    f'( {PLACE} ) || exit {PLACE_FAILED}\n'
                    'shift 3\n'
                    '"$@" && exit 0\n'
                    'refused=$?\n'
                    'rm -rf "$run"\n'
                    'exit "$refused"')


def job_files(request: SlurmSubmit) -> list[tuple[str, bytes, int]]:
    """(name in the run's folder, bytes, mode) of every file the batch script needs beside it, the script last."""
    spec = request.job.spec
    files = [(TORCHRUN_FILE, TORCHRUN_SOURCE.encode(), 0o644)]
    if spec.extra_env:
        files.append((ENV_FILE, env_file_text(spec).encode(), 0o600))
    if spec.user_command:
        files.append((f"{HOOK_DIR}/{HOOK_FILE}", join_hook_source(), 0o644))
    if spec.launcher == "spawn":
        files.append((SPAWN_FILE, SPAWN_SCRIPT.encode(), 0o644))
    if spec.launcher == "mpirun":
        files.append((MPIRUN_FILE, MPIRUN_SCRIPT.encode(), 0o644))
    return [*files, (SCRIPT_NAME, request.script.encode(), 0o644)]


def tar_of(files: list[tuple[str, bytes, int]]) -> bytes:
    """An uncompressed tar of `files` (folders made as their paths need)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        folders = sorted({name.rsplit("/", 1)[0] for name, _, _ in files if "/" in name})
        for folder in folders:
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name, data, mode in files:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def place_and_submit(conn: Connection, request: SlurmSubmit, cache: str, dest: str) -> CommandResult:
    """Copy the shipped code into the run's folder, write the job's files there, then run its sbatch line, in one
    command; sbatch's answer (ok: the job id on stdout). HostError when the files could not be written (nothing was
    submitted)."""
    result = conn.run(["sh", "-c", PLACE_AND_SUBMIT, "ddpctl-submit", request.remote_dir, cache, dest,
                       *request.argv], stdin=tar_of(job_files(request)), timeout=300)
    if result.exit_code == PLACE_FAILED:
        raise HostError(conn.label, f"could not write the job's files into {request.remote_dir}: "
                                    f"{result.stderr.strip()[:200]}")
    return result
