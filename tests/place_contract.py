"""The contract every place keeps, asked as a user asks it: `up --detach` of a `-- python script.py` run (the place's
own `up`), then the commands themselves (launcher/cli/app.py's main, in this process; `logs -f` in a process of its
own): `status` shows every node running with the epoch, loss and restarts the script's progress lines give (and
`ps`, torchrun's wrapper as a file it runs, not its source); `logs --rank R` shows each rank's lines, the `--env`
value and the world it joined among them; `logs -f` follows rank 0 and ends by itself when `down` stops the run and
pulls what it wrote; `pull` then brings back a pulled file lost here, and a second `pull` moves nothing and says so;
the summary's world size is the one the ranks joined (measured, not planned), and `report` has the run's row. A
second, short followed run beside it, which stops making progress, is ended by `--stall-timeout` and says so.
Nothing of either run is left.

tests/test_place_registry.py runs it on a toy place, this machine, two SSH hosts and the test Slurm cluster;
tests/test_remote_docker.py on two SSH hosts with the Docker runtime; tests/test_vast_up.py on a machine rented from
the Vast.ai stand-in. Where a place says a thing its own way (or cannot do it), `Said` holds that one line and the
contract asserts it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from infra.testbed import Testbed
from launcher.places.registry import place_named, place_of_record, run_up
from launcher.planning.request import UpOptions
from launcher.results.rundir import RunDir
from launcher.spec.hosts import HostSpec, parse_host
from launcher.spec.run_spec import RunSpec, new_run_id
from launcher.spec.torchrun import TORCHRUN_SOURCE
from tests.cli_in_process import ddpctl_in_process
from tests.cli_runner import ddpctl_argv, ddpctl_env
from tests.faults.fault_support import wait_for
from tests.test_local_place import processes_of

ENV_NAME, ENV_VALUE = "CONTRACT_GREETING", "hello from --env"
STEPS_PER_EPOCH = 2
# Every rank joins the process group (the world ddpctl measures from its join records), prints the --env value it
# was given, appends each step to a file of its own under $DDPCTL_OUTPUT_DIR (what `pull` and `down` bring back),
# and on rank 0 prints ddpctl's progress protocol as docs/guides/your-own-script.md tells users to.
SCRIPT = f"""import json, os, time
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
print(f"contract rank {{rank}} of world {{world}}: {ENV_NAME}={{os.environ.get('{ENV_NAME}')}}", flush=True)
steps = os.path.join(os.environ["DDPCTL_OUTPUT_DIR"], f"steps-rank-{{rank}}.txt")
began = time.monotonic()
for step in range(6000):  # 10 minutes at most: `down` ends it long before
    epoch, done, loss = step // {STEPS_PER_EPOCH} + 1, step % {STEPS_PER_EPOCH} + 1, round(2.0 / (step + 1), 4)
    print(f"toy step {{step}} of rank {{rank}}", flush=True)
    if rank == 0:
        print(json.dumps({{"ddpctl": "progress", "epoch": epoch, "epochs": 600, "step": done,
                          "steps": {STEPS_PER_EPOCH}, "loss": loss}}), flush=True)
        if done == {STEPS_PER_EPOCH}:
            print(json.dumps({{"ddpctl": "epoch", "epoch": epoch, "epochs": 600, "seconds": time.monotonic() - began,
                              "train_loss": loss}}), flush=True)
            began = time.monotonic()
    with open(steps, "a") as f:
        f.write(f"{{step}}\\n")
    time.sleep(0.1)
"""
STALL_SECONDS = 1.0
# One training step, then nothing more (a hung collective): what --stall-timeout ends.
STALLS = """import json, time
print(json.dumps({"ddpctl": "progress", "epoch": 1, "epochs": 2, "step": 1, "steps": 5, "loss": 0.5}), flush=True)
time.sleep(600)
"""
PULLED = "pulled {bytes} bytes into {run_path}/nodes (all files verified)"


@dataclass(frozen=True)
class Said:
    """What a place says where the contract lets it say it its own way (in one line each)."""

    running: str = "running"  # the state column of a node that runs
    stopped: str = "stopped run {run_id}"  # how `down`'s answer starts
    pull: str = PULLED  # a `pull` after `down` of a run one of whose pulled files was lost here: it comes back
    pull_again: str = PULLED  # the `pull` after that: nothing moves
    stall: str = "error: --stall-timeout: no training step for {seconds:g} s"  # how the stalled run ends
    stall_runs: bool = True  # False: the place refuses --stall-timeout (`stall` is that refusal)


# A Slurm job's state is Slurm's word; `down` cancels the job.
SLURM_SAYS = Said(running="RUNNING", stopped="cancelled job ")
# Vast.ai's `down` gives the machines back once the results are verified; nothing is left to pull from.
VAST_SAYS = Said(stopped="run {run_id}: machines destroyed (verified)",
                 pull="error: the rented machines of run {run_id} were destroyed; what was pulled is in {run_path}",
                 pull_again="error: the rented machines of run {run_id} were destroyed; what was pulled is in "
                            "{run_path}")
# A run on this machine writes its files in place: `pull` has nothing to fetch.
LOCAL_PULL = "error: run {run_id} is a local run and `pull` is for runs on hosts: its files are already in {run_path}"
LOCAL_SAYS = Said(pull=LOCAL_PULL, pull_again=LOCAL_PULL)


class Cli:
    """The commands on one run, as a user types them (`-i KEY --runs-dir DIR` added), run by ddpctl's main here."""

    def __init__(self, folder: Path, key: Path | None) -> None:
        self.folder = folder
        self.common = ["--runs-dir", str(folder / "runs"), *(["-i", str(key)] if key else [])]

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        """The command, which must succeed."""
        done = ddpctl_in_process(*args, *self.common, cwd=self.folder)
        assert done.returncode == 0, f"ddpctl {' '.join(args)}: {done.returncode}\n{done.stdout}{done.stderr}"
        return done

    def said(self, *args: str) -> str:
        """The command's answer: its first line (on stdout, or where it has none on stderr: a refusal's)."""
        done = ddpctl_in_process(*args, *self.common, cwd=self.folder)
        text = (done.stdout.strip() or done.stderr.strip()) + "\n"
        return text.splitlines()[0]

    def follow(self, *args: str) -> subprocess.Popen[bytes]:
        """`ddpctl logs ... -f` in a process of its own, as a user leaves it running in a terminal; its output in
        follow.out and follow.err."""
        with open(self.folder / "follow.out", "wb") as out, open(self.folder / "follow.err", "wb") as err:
            return subprocess.Popen(ddpctl_argv(*args, *self.common), cwd=self.folder, env=ddpctl_env(), stdout=out,
                                    stderr=err)

    def followed(self) -> tuple[list[int], str]:
        """The steps of rank 0 that `logs -f` has shown so far, and what it said on stderr."""
        out = (self.folder / "follow.out").read_text(errors="replace")
        return ([int(n) for n in re.findall(r"^toy step (\d+) of rank 0$", out, flags=re.MULTILINE)],
                (self.folder / "follow.err").read_text(errors="replace"))


def keeps_the_contract(name: str, folder: Path, capsys: pytest.CaptureFixture[str], bed: Testbed | None = None,
                       hosts: tuple[HostSpec, ...] | None = None, extra: dict[str, Any] | None = None,
                       said: Said = Said(), left_in: Callable[[RunDir], list[Path]] | None = None,
                       stall_args: tuple[str, ...] | None = ()) -> RunDir:
    """The contract (this module's docstring) through place `name`: on the bed's hosts, one node each, when given
    (`hosts`: the --host options instead; `extra`: its own options, e.g. what it rents or allocates). A place with
    one node runs two processes on it, so that every place's world has two ranks. `stall_args`: the same place as
    `ddpctl up` options, for the --stall-timeout run (None: no such run), which runs beside the contract's (it
    mostly waits). `left_in`: where else the run's processes would be named (a job's folder). The run's
    directory."""
    (folder / "script.py").write_text(SCRIPT)
    if hosts is None:
        hosts = tuple(parse_host(h.spec) for h in bed.hosts) if bed else ()
    nnodes = len(hosts) if place_named(name).hosts_per_node else 1  # one node per --host where the user names them
    spec = RunSpec(run_id=new_run_id(None, "script", "none", ("python", "script.py")), nproc_per_node=3 - nnodes,
                   nnodes=nnodes, user_command=("python", "script.py"), extra_env=((ENV_NAME, ENV_VALUE),),
                   python=sys.executable if place_named(name).runs_here else "python3")
    key = Path(bed.client_key_path) if bed else None
    options = UpOptions(runs_dir=folder / "runs", provider=name, detach=True, show_progress=False,
                        show_output=False, hosts=hosts, identity_file=key, auto_rdzv_port=True, **(extra or {}))
    follower: subprocess.Popen[bytes] | None = None
    stalls: Stalls | None = None
    where: list[Path] = []
    try:
        started = run_up(spec, options)
        assert started.exit_code == 0 and started.run_dir is not None
        # Once this run was shipped (what `up` ships from its working directory must not change meanwhile).
        stalls = None if stall_args is None else Stalls(folder, said, stall_args)
        run_dir = RunDir.open(started.run_dir)
        where = _places_of(run_dir, bed, left_in)
        assert place_of_record(run_dir.typed_record()) is place_named(name)
        cli, run, world = Cli(folder, key), str(run_dir.path), spec.world_size

        def trains() -> list[dict[str, Any]] | None:  # every node running, rank 0's node in its second epoch
            rows = json.loads(cli("status", run, "--json").stdout)["nodes"]
            return rows if all(r["state"] == said.running for r in rows) and any(
                (r["epoch"] or 0) >= 2 and r["loss"] is not None for r in rows) else None

        rows = wait_for("every node running in its second epoch, in status", trains, timeout=120, every=0.5)
        assert [row["node"] for row in rows] == list(range(nnodes))
        (lead,) = [row for row in rows if row["epoch"]]  # rank 0's node: the script prints its progress there
        assert lead["epochs"] == 600 and 0 < lead["loss"] < 2 and [r["restarts"] for r in rows] == [0] * nnodes
        shows_no_wrapper_source(where)
        for rank in range(world):  # each rank's own lines, the --env value and the world it joined among them
            lines = cli("logs", run, "--rank", str(rank), "-n", "1000").stdout
            assert f"contract rank {rank} of world {world}: {ENV_NAME}={ENV_VALUE}\n" in lines, lines
            assert re.search(rf"^toy step \d+ of rank {rank}$", lines, flags=re.MULTILINE), lines
        follower = cli.follow("logs", run, "--rank", "0", "-f")
        wait_for("logs -f to show rank 0's lines", lambda: cli.followed()[0], timeout=60, every=0.2)
        answer = cli("down", run)  # its line (after the job's end, where a scheduler tells it)
        assert any(line.startswith(said.stopped.format(run_id=run_dir.run_id)) for line in
                   (answer.stdout + answer.stderr).splitlines()), answer
        assert follower.wait(timeout=30) == 0, cli.followed()  # it ends by itself once the run has ended
        followed, err = cli.followed()
        assert "Traceback" not in err, err
        rows = json.loads(cli("status", run, "--json").stdout)["nodes"]
        assert all(row["state"] != said.running for row in rows), rows
        # down pulled what each rank wrote, up to its stop (a step is printed, then written down)
        steps = _steps_pulled(run_dir, world)
        assert min(steps.values()) >= 0 and steps[0] >= max(followed) - 1, (steps, followed)
        pulls_twice(cli, run_dir, said)
        summary = json.loads((run_dir.path / "summary.json").read_text())
        assert (summary["world_size"], summary["world_measured"]) == (world, True), summary
        assert json.loads(cli("status", run, "--json").stdout)["world_size"] == world  # as status tells it
        made = ddpctl_in_process("report", run, "--json", "--out", str(folder / "report"), cwd=folder)
        assert made.returncode == 0, made.stderr
        report = json.loads(made.stdout)
        assert [(r["run_id"], r["world_size"]) for r in report["rows"]] == [(run_dir.run_id, world)], report
        wait_for("nothing of the run left", lambda: not any(processes_of(p) for p in where), timeout=10)
        if stalls is not None:
            stalls.ended(bed, left_in)
    finally:
        for process in (follower, stalls.process if stalls else None):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
        _kill_what_is_left(where + (stalls.places if stalls else []))
    capsys.readouterr()
    return run_dir


def pulls_twice(cli: Cli, run_dir: RunDir, said: Said) -> None:
    """`pull` after `down`: where it pulls, a file lost here comes back (and only it), then a second pull moves
    nothing; where it cannot, it says so both times."""
    run, words = str(run_dir.path), {"run_id": run_dir.run_id, "run_path": str(run_dir.path)}
    lost = list(run_dir.path.glob("nodes/*/out/steps-rank-0.txt")) if said.pull == PULLED else []
    kept = lost[0].read_bytes() if lost else b""
    for path in lost:
        path.unlink()
    assert cli.said("pull", run) == said.pull.format(bytes=f"{len(kept):,}", **words)
    assert not lost or lost[0].read_bytes() == kept
    assert cli.said("pull", run) == said.pull_again.format(bytes=0, **words)


class Stalls:
    """`ddpctl up --stall-timeout S ARGS -- python stalls.py` (followed) in a process of its own: a script that makes
    one step and hangs, ended after S s in one line (or refused at once, in the place's one line, where it cannot
    watch a run); run in the folder stalls/, its output in stalls.out and stalls.err, its run under stalled-runs/."""

    def __init__(self, folder: Path, said: Said, args: tuple[str, ...]) -> None:
        # A folder of its own to ship: the contract's commands write beside it (runs/, follow.out) meanwhile.
        self.folder, self.said = folder / "stalls", said
        self.places: list[Path] = []  # where its processes would be named, once its run directory is known
        self.folder.mkdir()
        (self.folder / "stalls.py").write_text(STALLS)
        argv = ("up", "--stall-timeout", f"{STALL_SECONDS:g}", "--runs-dir", str(folder / "stalled-runs"), *args,
                "--", "python", "stalls.py")
        self.process: subprocess.Popen[bytes] | None = None
        if not said.stall_runs:
            refused = ddpctl_in_process(*argv, cwd=self.folder)  # `up` checks its options before anything starts
            assert (refused.returncode, refused.stderr.strip()) == (1, f"error: {said.stall}"), refused.stderr
            return
        with open(folder / "stalls.out", "wb") as out, open(folder / "stalls.err", "wb") as err:
            self.process = subprocess.Popen(ddpctl_argv(*argv), cwd=self.folder, env=ddpctl_env(), stdout=out,
                                            stderr=err)

    def ended(self, bed: Testbed | None, left_in: Callable[[RunDir], list[Path]] | None) -> None:
        """It ended by itself, in the place's line, stopped for the stall, with nothing of it left."""
        if self.process is None:
            return
        code = self.process.wait(timeout=180)
        err = (self.folder.parent / "stalls.err").read_text(errors="replace").strip()
        assert code == 1 and err.splitlines()[-1].startswith(self.said.stall.format(seconds=STALL_SECONDS)), err
        (run_path,) = (self.folder.parent / "stalled-runs").glob("stalls-*")
        run_dir = RunDir.open(run_path)
        self.places = _places_of(run_dir, bed, left_in)
        assert "stop_requested" in [e["event"] for e in run_dir.events()]  # recorded as stopped for the stall
        wait_for("nothing of the stalled run left", lambda: not any(processes_of(p) for p in self.places),
                 timeout=10)


def shows_no_wrapper_source(where: list[Path]) -> None:
    """`ps` of the run's processes (those naming its folders, as they train) shows torchrun's wrapper and the node's
    supervisor as files they run, never their source given to `python -c` (launcher/spec/attempt_logs.py's text, or
    a program of launcher/remote/program.py, kilobytes of either)."""
    sources = (TORCHRUN_SOURCE.encode()[:200], b"_SOURCES = [(")
    pids = {pid for p in where for pid in processes_of(p)}
    assert pids, f"no process names {where} while the run trains"
    shown = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            shown[pid] = Path(f"/proc/{pid}/cmdline").read_bytes()
    assert shown, f"no command line of the run's processes {sorted(pids)} could be read"
    with_source = {pid: line.replace(b"\0", b" ")[:200] for pid, line in shown.items()
                   if any(source in line for source in sources)}
    assert not with_source, with_source


def _places_of(run_dir: RunDir, bed: Testbed | None, left_in: Callable[[RunDir], list[Path]] | None) -> list[Path]:
    """Where a run's processes would name: its run directory, its folder on each host, what else the place says."""
    hosts = [Path(h.home, ".ddpctl", "runs", run_dir.run_id) for h in bed.hosts] if bed else []
    return [run_dir.path, *hosts, *(left_in(run_dir) if left_in else [])]


def _kill_what_is_left(where: list[Path]) -> None:
    for pid in [pid for p in where for pid in processes_of(p)]:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _steps_pulled(run_dir: RunDir, world: int) -> dict[int, int]:
    """Each rank's steps in the run directory (what `pull` and `down` brought back; written in place here)."""
    steps = {rank: -1 for rank in range(world)}
    for path in run_dir.path.glob("**/steps-rank-*.txt"):
        rank = int(path.stem.rsplit("-", 1)[1])
        numbers = [int(n) for n in path.read_text().split() if n.isdigit()]
        steps[rank] = max([steps[rank], *numbers])
    return steps

