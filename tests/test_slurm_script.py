"""Slurm's batch script and sbatch line as text (pure, like torchrun's argv), the request's validation, the
preflight refusals drawn from what a cluster reports, and the job states read from scontrol and sacct."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from launcher.errors import SpecError
from launcher.places.slurm import job_end, mpi_job
from launcher.places.slurm.batch_script import (
    GPUS_PER_NODE,
    GRES,
    SlurmJob,
    batch_script,
    env_file_text,
    sbatch_argv,
)
from launcher.places.slurm.cluster import (
    ClusterFacts,
    Partition,
    default_gpus_note,
    gpu_count,
    key_values,
    preflight_refusal,
)
from launcher.places.slurm.job_states import job_status
from launcher.places.slurm.scheduler import (
    SlurmScheduler,
    SlurmSubmit,
    launcher_refusal,
    status_from_sacct,
    status_from_scontrol,
)
from launcher.results.rundir import RunDir
from launcher.spec.run_spec import RunSpec
from launcher.spec.slurm_request import SlurmRequest, time_minutes

RUN = "/scratch/u/ddpctl/runs/r1"
SPEC = RunSpec(run_id="r1", nnodes=2, nproc_per_node=4, python="python3", epochs=2)
TRAINER_LINE = (
    "python3 \"$DDPCTL_TORCHRUN\" --nnodes 2 --rdzv-backend c10d --rdzv-endpoint \"$DDPCTL_RDZV_ENDPOINT\" "
    "--rdzv-id \"$SLURM_JOB_ID\" --nproc-per-node 4 --max-restarts 0 --log-dir logs --redirects 3 -m trainer "
    "--model mnist-cnn --dataset synthetic --epochs 2 --batch-size 32 --lr 0.01 --save-every 1 --seed 0 "
    "--backend auto --out-dir out --snapshot-dir out/snapshots > \"$ws/torchrun.out\" 2>&1 < /dev/null"
)


def test_batch_script_of_a_two_node_gpu_run_is_exactly_this_text() -> None:
    request = SlurmRequest(nodes=2, partition="gpu", time="2:00:00", account="acc", qos="normal", constraint="a100",
                           sbatch_options=("--mem=64G",), prelude=("module load cuda/12.4",))
    job = SlurmJob(SPEC, request, RUN, gpu_flag=GPUS_PER_NODE)
    assert batch_script(job) == f"""#!/bin/bash
# ddpctl run r1: 2 node(s) x 4 process(es); submitted as written here
#SBATCH --job-name=ddpctl-r1
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=4
#SBATCH --time=2:00:00
#SBATCH --partition=gpu
#SBATCH --account=acc
#SBATCH --qos=normal
#SBATCH --constraint=a100
#SBATCH --chdir={RUN}
#SBATCH --output={RUN}/slurm-%j.out
#SBATCH --open-mode=append
#SBATCH --no-requeue
#SBATCH --mem=64G
# --prelude: the cluster's own set-up (module load, conda activate), as a block of its own: checked by
# bash -n, run in this shell, then back in the job's folder
ddpctl_dir=$PWD
ddpctl_prelude='module load cuda/12.4'
if ! bash -n -c "$ddpctl_prelude"; then
  echo "ddpctl: the --prelude lines are not valid shell (bash -n, above): the job ends" >&2; exit 2
fi
eval "$ddpctl_prelude"
cd "$ddpctl_dir"
set -e
export PYTHONUNBUFFERED=1 TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
# The allocation's first node hosts the c10d store, on a port derived from the job id.
rdzv_host=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export DDPCTL_RDZV_ENDPOINT="$rdzv_host:$((20000 + SLURM_JOB_ID % 20000))"
echo "ddpctl: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, rendezvous at $DDPCTL_RDZV_ENDPOINT"
# each node's torchrun, keeping every attempt's logs: ddpctl's launcher/spec/attempt_logs.py as torchrun_attempts.py
DDPCTL_TORCHRUN="$PWD/torchrun_attempts.py"
export DDPCTL_TORCHRUN
read -r -d '' node_script <<'NODE' || true
ws="$PWD/nodes/$SLURM_NODEID"
mkdir -p "$ws/out" "$ws/logs"
export PYTHONPATH="$PWD/code${{PYTHONPATH:+:$PYTHONPATH}}"
cd "$ws"
trap : TERM
{TRAINER_LINE}
code=$?
echo "$code" > "$ws/exit_code.tmp" && mv "$ws/exit_code.tmp" "$ws/exit_code"
exit "$code"
NODE
srun --nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c "$node_script"
"""
    assert sbatch_argv(job) == ["sbatch", "--parsable", f"{RUN}/job.sbatch"]


def test_gpus_as_gres_on_clusters_without_cons_tres_and_cpus_per_task_on_cpu_nodes() -> None:
    gres = batch_script(SlurmJob(SPEC, SlurmRequest(nodes=2), RUN, gpu_flag=GRES))
    assert "#SBATCH --gres=gpu:4\n" in gres and "--gpus-per-node" not in gres
    cpu = batch_script(SlurmJob(SPEC, SlurmRequest(nodes=2), RUN, gpu_flag=None, cpus_per_task=4))
    assert "#SBATCH --cpus-per-task=4\n" in cpu and "gpu" not in cpu.split("set -e")[0]
    assert "#SBATCH --partition" not in cpu and "#SBATCH --time" not in cpu  # the cluster's defaults


def test_a_user_command_runs_in_each_nodes_own_copy_with_quoted_arguments() -> None:
    spec = RunSpec(run_id="r2", nnodes=2, nproc_per_node=1, python="/opt/venv/bin/python",
                   user_command=("python", "train.py", "--note", "it's $HOME; rm -rf /"))
    script = batch_script(SlurmJob(spec, SlurmRequest(nodes=2), RUN, gpu_flag=None))
    assert ('rm -rf "$ws/code" && cp -R code "$ws/code"\nexport DDPCTL_OUTPUT_DIR="$ws/out" '
            'DDPCTL_NODE_RANK="$SLURM_NODEID" DDPCTL_NNODES=2 DDPCTL_JOIN_DIR="$ws/logs/joined"\n') in script
    # The join hook first on the path: every process records the world it joins (the world size is measured).
    assert 'export PYTHONPATH="$PWD/hook:$ws/code${PYTHONPATH:+:$PYTHONPATH}"\n' in script
    assert 'cd "$ws/code"\n' in script
    assert ("--log-dir ../logs --redirects 3 --no-python /opt/venv/bin/python train.py --note "
            "'it'\"'\"'s $HOME; rm -rf /' > \"$ws/torchrun.out\"") in script


@pytest.mark.parametrize(("text", "minutes"), [("30", 30), ("10:30", 10.5), ("2:00:00", 120), ("1-2", 1560),
                                               ("1-2:30", 1590), ("0-0:0:30", 0.5)])
def test_slurm_time_formats(text: str, minutes: float) -> None:
    assert time_minutes(text) == minutes


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"time": "2h"}, "--time '2h'"), ({"time": "0"}, "above zero"), ({"partition": "gpu debug"}, "--partition"),
    ({"sbatch_options": ("--mem=1G\n#SBATCH --x",)}, "--sbatch-option"), ({"sbatch_options": ("-N 3",)}, "one long"),
    ({"sbatch_options": ("--nodes=3",)}, "sets --nodes itself"), ({"prelude": ("a\nb",)}, "one shell line"),
    ({"workdir": "/my scratch"}, "without spaces"), ({"nodes": 0}, "--nodes 0"),
])
def test_bad_requests_are_refused_in_one_line(kwargs: dict[str, object], named: str) -> None:
    with pytest.raises(SpecError, match=None) as e:
        SlurmRequest(**kwargs)  # type: ignore[arg-type]
    assert named in str(e.value) and "\n" not in str(e.value)


def _facts(**partition: object) -> ClusterFacts:
    base = {"name": "gpu", "state": "UP", "max_minutes": 60.0, "total_nodes": 4, "gpus_per_node": [4, 4, 2, 0],
            "cpus_per_node": [32] * 4}
    return ClusterFacts(Partition(**{**base, **partition}), "select/cons_tres", "/w", "python3", "2.4")  # type: ignore


OK_LOGIN = {"writable": True, "torch": "2.4"}


@pytest.mark.parametrize(("spec_kw", "request_kw", "facts", "login", "named"), [
    ({}, {}, _facts(state="DOWN"), OK_LOGIN, "partition gpu is DOWN"),
    ({"nnodes": 5}, {"nodes": 5}, _facts(), OK_LOGIN, "has 4 node(s), not the 5"),
    ({}, {"time": "2:00:00"}, _facts(), OK_LOGIN, "over partition gpu's MaxTime (01:00:00)"),
    ({"nnodes": 3}, {"nodes": 3}, _facts(), OK_LOGIN, "has 2 node(s) with 4 GPUs, 3 needed"),
    ({"nproc_per_node": 64}, {}, _facts(gpus_per_node=[0] * 4), OK_LOGIN, "no GPUs and at most 32 CPUs"),
    ({}, {}, _facts(), {"writable": False, "why": "Permission denied"}, "not writable"),
    ({}, {}, _facts(), {"writable": True, "torch_error": "ModuleNotFoundError: torch"}, "cannot import torch"),
])
def test_preflight_refusals(spec_kw: dict[str, int], request_kw: dict[str, object], facts: ClusterFacts,
                            login: dict[str, object], named: str) -> None:
    spec = RunSpec(run_id="r", **{"nnodes": 2, "nproc_per_node": 4, **spec_kw})  # type: ignore[arg-type]
    refusal = preflight_refusal(spec, SlurmRequest(**{"nodes": 2, **request_kw}), facts, login)  # type: ignore
    assert named in refusal and "\n" not in refusal


def test_a_run_that_fits_is_not_refused() -> None:
    spec = RunSpec(run_id="r", nnodes=2, nproc_per_node=4)
    assert preflight_refusal(spec, SlurmRequest(nodes=2, time="59"), _facts(), OK_LOGIN) == ""


def test_scontrol_and_sacct_lines_become_job_states() -> None:
    line = ("JobId=7 JobName=ddpctl-r1 UserId=u(1001) JobState=PENDING Reason=Resources Dependency=(null) "
            "Restarts=1 ExitCode=0:0 SubmitTime=2026-11-25T15:29:27 StartTime=Unknown EndTime=Unknown "
            "NodeList=(null) NumCPUs=8 TRES=cpu=8,node=2,billing=8,gres/gpu=8 Command=/w/job.sbatch")
    status = status_from_scontrol("7", line)
    assert (status.state, status.reason, status.cpus, status.gpus, status.restarts) == ("PENDING", "Resources", 8,
                                                                                        8, 1)
    assert status.start_time is None and status.submit_time is not None and not status.finished
    ended = status_from_sacct("7", "CANCELLED by 1001|0:15|2026-11-25T15:29:27|2026-11-25T15:29:30|"
                                   "2026-11-25T15:30:30|n[1-2]|8|None")
    assert (ended.state, ended.reason, ended.exit_code, ended.finished) == ("CANCELLED", "by 1001", "0:15", True)
    assert ended.end_time - ended.start_time == 60  # type: ignore[operator]
    assert key_values("A=1 B=x y C=") == {"A": "1", "B": "x y", "C": ""}
    assert [gpu_count(g) for g in ("gpu:4", "gpu:a100:2(S:0-1)", "(null)", "gpu:2,mps:100")] == [4, 2, 0, 2]


def test_a_launcher_slurm_cannot_run_is_refused_before_the_cluster_is_asked() -> None:
    spec = RunSpec(run_id="r", nnodes=2, nproc_per_node=1, launcher="mpirun", user_command=("python", "x.py"))
    with pytest.raises(SpecError, match="--requeue with --launcher mpirun: "):
        SlurmScheduler(SlurmRequest(nodes=2, time="10", max_requeues=1), "login").submit_dryrun(spec, None)


def test_an_mpi_job_starts_its_ranks_by_srun_pmix_or_mpirun_in_the_allocation_with_its_ranks_as_tasks() -> None:
    spec = RunSpec(run_id="r10", nnodes=2, nproc_per_node=2, python="python3", launcher="mpirun",
                   user_command=("python", "mp.py", "--n", "a b"))
    script = batch_script(SlurmJob(spec, SlurmRequest(nodes=2), RUN, gpu_flag=None))
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n" in script
    assert "DDPCTL_TORCHRUN" not in script
    assert ('for k in $(seq 0 1); do mkdir -p "nodes/$k/out" "nodes/$k/logs" && rm -rf "nodes/$k/code" && '
            'cp -R code "nodes/$k/code"; done\nexport DDPCTL_RUN="$PWD" DDPCTL_NPROC=2 DDPCTL_NNODES=2\n') in script
    # Chosen in the job, after the prelude: srun --mpi=pmix where both sides speak PMIx, else mpirun.
    assert 'if [ -z "${DDPCTL_SLURM_MPI:-}" ]; then\n' in script
    assert ('if [ "$DDPCTL_SLURM_MPI" = pmix ]; then\n  sh "$PWD/mpirun.sh" nodes/0/logs srun --mpi=pmix --nodes=2 '
            '--ntasks-per-node=2 --kill-on-bad-exit=1 bash -c ') in script
    assert ('\nelse\n  sh "$PWD/mpirun.sh" nodes/0/logs mpirun -np 4 --map-by ppr:2:node --bind-to none bash -c '
            ) in script
    assert script.count("ddpctl-rank python3 -m mpi4py mp.py --n 'a b' > nodes/0/torchrun.out 2>&1 < /dev/null || "
                        "code=$?\n") == 2
    assert script.endswith('fi\necho "$code" > nodes/0/exit_code.tmp && mv nodes/0/exit_code.tmp nodes/0/exit_code\n'
                           'exit "$code"\n')


@pytest.mark.integration  # bash runs the lines, with stand-ins for srun and ompi_info on PATH
@pytest.mark.parametrize(("srun_lists", "ompi_info", "given", "chosen"), [
    ("pmix\nspecific pmix plugin versions available: pmix_v4", "MCA pmix: ext3x (MCA v2.1.0)", "", "pmix"),
    ("pmix", "MCA pmix: pmix3x (MCA v2.1.0)", "", "pmix"),
    ("pmix", "Open MPI v5.0.3", "", "pmix"),  # 5 and later: PMIx always
    ("pmix", "MCA pmix: isolated (MCA v2.1.0)", "", "mpirun"),  # Open MPI without a PMIx client
    ("none\npmi2", "MCA pmix: ext3x (MCA v2.1.0)", "", "mpirun"),  # Slurm without its pmix plugin
    ("pmix", "MCA pmix: ext3x (MCA v2.1.0)", "mpirun", "mpirun"),  # the user's choice wins
    ("none", "", "pmix", "pmix"),
])
def test_how_the_mpi_ranks_start_is_chosen_in_the_job(tmp_path: Path, srun_lists: str, ompi_info: str, given: str,
                                                      chosen: str) -> None:
    (tmp_path / "srun").write_text(f"#!/bin/sh\nprintf '%s\\n' 'MPI plugin types are...' '{srun_lists}' >&2\n")
    (tmp_path / "ompi_info").write_text(f"#!/bin/sh\necho '{ompi_info}'\n")
    for tool in ("srun", "ompi_info"):
        (tmp_path / tool).chmod(0o755)
    lines = [*mpi_job.starter_lines(), 'echo "chosen $DDPCTL_SLURM_MPI"']
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", **({"DDPCTL_SLURM_MPI": given} if given else {})}
    done = subprocess.run(["bash", "-ec", "\n".join(lines)], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == f"chosen {chosen}", done.stdout + done.stderr
    said = "srun --mpi=pmix" if chosen == "pmix" else "Open MPI's mpirun"
    assert done.stdout.splitlines()[0] == f"ddpctl: the MPI ranks are started by {said} (DDPCTL_SLURM_MPI={chosen})"
    wrong = subprocess.run(["bash", "-ec", "\n".join(lines)], env={**env, "DDPCTL_SLURM_MPI": "openmpi"},
                           capture_output=True, text=True, timeout=30)
    assert wrong.returncode == 2 and wrong.stderr == "ddpctl: DDPCTL_SLURM_MPI=openmpi: give pmix or mpirun\n"


def test_env_values_stay_out_of_the_script_which_sources_them_from_a_file_beside_it() -> None:
    spec = RunSpec(run_id="r3", nnodes=2, nproc_per_node=1, python="python3", user_command=("python", "t.py"),
                   extra_env=(("WANDB_API_KEY", "s3cr3t value"), ("X", "1")))
    script = batch_script(SlurmJob(spec, SlurmRequest(nodes=2), RUN, gpu_flag=None))
    assert "s3cr3t" not in script
    assert ("export PYTHONUNBUFFERED=1 TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1\n"
            "# --env WANDB_API_KEY X: the values from ddpctl.env beside this script (mode 0600, written by ddpctl)\n"
            ". ./ddpctl.env\n") in script
    # Sourced by the batch shell before srun: every node's task inherits them (srun exports the environment).
    assert script.index(". ./ddpctl.env") < script.index("srun --nodes=2")
    assert env_file_text(spec) == "export WANDB_API_KEY='s3cr3t value'\nexport X=1\n"
    plain = batch_script(SlurmJob(RunSpec(run_id="r4", python="python3"), SlurmRequest(), RUN, gpu_flag=None))
    assert "ddpctl.env" not in plain


def test_a_requeued_user_command_counts_the_newest_allocations_joins() -> None:
    spec = RunSpec(run_id="r5", nnodes=1, nproc_per_node=1, python="python3", user_command=("python", "t.py"))
    script = batch_script(SlurmJob(spec, SlurmRequest(time="1", max_requeues=1), RUN, gpu_flag=None))
    assert '[ -d "$ws/code" ] || cp -R code "$ws/code"\nrm -rf "$ws/logs/joined"\n' in script


def test_the_dry_run_prints_the_sbatch_line_and_the_script_and_says_the_rest_beside_it() -> None:
    spec = RunSpec(run_id="r6", nnodes=2, nproc_per_node=1, python="python3")
    job = SlurmJob(spec, SlurmRequest(nodes=2), RUN, gpu_flag=GPUS_PER_NODE)
    submit = SlurmSubmit(job, batch_script(job), "/scratch/u/ddpctl", "login", ("the partition",), ("look out",))
    assert submit.describe() == f"# sbatch line: sbatch --parsable {RUN}/job.sbatch\n# {RUN}/job.sbatch:\n" + \
        submit.script
    assert submit.notes() == [f"Slurm job on login: 2 node(s) x 1 process(es), run folder {RUN}",
                              "unknown: the partition", "warning: look out"]
    assert len(submit.script.splitlines()) < 50  # torchrun's wrapper is a file beside it, not in its text


def test_without_a_probe_the_script_still_asks_for_the_gpus() -> None:
    spec = RunSpec(run_id="r7", nnodes=2, nproc_per_node=4, python="python3")
    unprobed = SlurmScheduler(SlurmRequest(nodes=2), "login").submit_dryrun(spec, None)
    assert "#SBATCH --gpus-per-node=4\n" in unprobed.script
    assert "--gres=gpu:N" in unprobed.unknown[0] and "--cpus-per-task=N" in unprobed.unknown[0]


def test_the_default_of_one_process_per_node_is_noted_where_the_nodes_have_more() -> None:
    spec = RunSpec(run_id="r8", nnodes=2, nproc_per_node=1, python="python3")
    cpu = Partition("debug", "UP", None, 2, [0, 0], [8, 8])
    gpu = Partition("gpu", "UP", None, 2, [4, 4], [64, 64])
    defaulted = SlurmRequest(nodes=2, gpus_given=False)
    assert default_gpus_note(spec, defaulted, cpu) == (
        "--gpus not given: 1 process per node on partition debug, which has no GPUs (its nodes have 8 CPUs); give "
        "--gpus N for N processes (and CPUs) per node")
    assert default_gpus_note(spec, defaulted, gpu).endswith("nodes have up to 4 GPUs: give --gpus 4 to use them")
    assert default_gpus_note(spec, SlurmRequest(nodes=2), cpu) == ""  # --gpus 1 given: nothing to say
    assert default_gpus_note(spec, defaulted, Partition("one", "UP", None, 2, [1, 1], [8, 8])) == ""


def test_a_spawn_job_runs_the_script_once_per_node_told_where_it_sits() -> None:
    spec = RunSpec(run_id="r9", nnodes=2, nproc_per_node=2, python="python3", launcher="spawn",
                   user_command=("python", "sp.py", "--x", "a b"))
    script = batch_script(SlurmJob(spec, SlurmRequest(nodes=2), RUN, gpu_flag=None))
    assert ('export DDPCTL_OUTPUT_DIR="$ws/out" DDPCTL_NODE_RANK="$SLURM_NODEID" DDPCTL_NNODES=2 '
            'DDPCTL_JOIN_DIR="$ws/logs/joined"\nspawn="$PWD/spawn.sh"\nexport DDPCTL_NPROC_PER_NODE=2\n'
            'export DDPCTL_MASTER_ADDR="${DDPCTL_RDZV_ENDPOINT%:*}" DDPCTL_MASTER_PORT="${DDPCTL_RDZV_ENDPOINT##*:}"\n'
            ) in script
    assert ("""sh "$spawn" ../logs python3 python3 sp.py --x 'a b' > "$ws/torchrun.out" 2>&1 < /dev/null\n""") in script
    assert "DDPCTL_TORCHRUN\" --nnodes" not in script  # no torchrun on the nodes
    assert "srun --nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c \"$node_script\"\n" in script


@pytest.mark.parametrize(("launcher", "requeued", "named"), [
    ("mpirun", True, "--requeue with --launcher mpirun: the time limit's signal is passed on to torchrun's workers"),
    ("spawn", True, "--requeue with --launcher spawn: the time limit's signal is passed on to torchrun's workers"),
    ("spawn", False, ""), ("mpirun", False, ""), ("torchrun", True, ""),
])
def test_each_launcher_runs_on_slurm_or_is_refused_saying_why(launcher: str, requeued: bool, named: str) -> None:
    spec = RunSpec(run_id="r", python="python3", launcher=launcher, user_command=("python", "t.py"))
    request = SlurmRequest(time="10", max_requeues=1) if requeued else SlurmRequest()
    assert launcher_refusal(spec, request).startswith(named)


@pytest.mark.parametrize(("said", "named"), [
    ("ddpctl: the MPI ranks are started by srun --mpi=pmix (DDPCTL_SLURM_MPI=pmix)\n", "srun --mpi=pmix"),
    ("ddpctl: the MPI ranks are started by Open MPI's mpirun (DDPCTL_SLURM_MPI=mpirun)\n", "mpirun"),
])
def test_a_failed_mpi_job_names_what_started_its_ranks_and_the_exception(tmp_path: Path, said: str,
                                                                          named: str) -> None:
    spec = RunSpec(run_id="m1", nnodes=2, nproc_per_node=2, python="python3", launcher="mpirun",
                   user_command=("python", "fails.py"))
    run_dir = RunDir.create(tmp_path / "runs", spec, {"provider": "slurm"})
    node = run_dir.path / "nodes" / "0"
    node.mkdir(parents=True)
    # What launcher/remote/mpirun.sh leaves in node 0's torchrun.out: the last traceback, to its exception.
    (node / "torchrun.out").write_text('Traceback (most recent call last):\n  File "fails.py", line 4, in <module>\n'
                                       '    raise RuntimeError("rank 3 gives up")\nRuntimeError: rank 3 gives up\n')
    (node / "exit_code").write_text("1\n")
    (run_dir.path / "slurm-12.out").write_text(f"ddpctl: job 12 on n[1-2], rendezvous at n1:20012\n{said}")
    failed = job_status("12", "FAILED", exit_code="1:0", nodes="n[1-2]")
    failure = job_end.job_failure(run_dir, failed, "job 12 FAILED (exit 1:0)", None)
    assert failure["summary"] == f"{named} on node 0 (n1) exited with 1: RuntimeError: rank 3 gives up", failure
