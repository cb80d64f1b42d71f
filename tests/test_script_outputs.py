"""A user's own DDP script on two SSH test-bed hosts (`ddpctl up --host A --host B -- python SCRIPT`): what it
writes comes back from every node, verified, and the shipping note says what the ignore files left out.

The script is written the way the PyTorch DDP tutorial's multinode.py is (CPU and gloo here): `snapshot.pt` in its
working directory every `save_every` epochs by each node's local rank 0, "Resuming training from snapshot at
Epoch N" when one is there. It lives in a subfolder and reads a data file beside it. The hosts' logins have
`python3` on PATH and no `python`, so `-- python ...` runs only because `python` means the node's interpreter.
Unlike the tutorial, it frees its trainer before destroy_process_group(): with gloo, torch 2.13 aborts a process
whose DDP model is still alive as it exits (launcher/execute/failures/hints.py's exit_abort_hint)."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.testbed import Testbed, TestHost
from tests.plain_lines import unstamped
from tests.testbed_fixtures import REPO, connect, lent, run_ddpctl

TUTORIAL = r'''
import gc, json, os, sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

SETTINGS = json.loads((Path(__file__).parent / "settings.json").read_text())  # a data file beside the script


class MyTrainDataset(Dataset):
    def __init__(self, size):
        g = torch.Generator().manual_seed(0)
        self.data = [(torch.rand(20, generator=g), torch.rand(1, generator=g)) for _ in range(size)]

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        return self.data[index]


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every, snapshot_path):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        if os.path.exists(snapshot_path):
            print("Loading snapshot")
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model)

    def _load_snapshot(self, snapshot_path):
        snapshot = torch.load(snapshot_path)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at Epoch {self.epochs_run}")

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        loss = F.mse_loss(self.model(source), targets)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def _run_epoch(self, epoch):
        b_sz = len(next(iter(self.train_data))[0])
        print(f"[GPU{self.global_rank}] Epoch {epoch} | Batchsize: {b_sz} | Steps: {len(self.train_data)}")
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            loss = self._run_batch(source, targets)
        return loss

    def _save_snapshot(self, epoch):
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch}
        torch.save(snapshot, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}")

    def train(self, max_epochs):
        Path("metrics").mkdir(exist_ok=True)
        for epoch in range(self.epochs_run, max_epochs):
            loss = self._run_epoch(epoch)
            with open(f"metrics/rank-{self.global_rank}.csv", "a") as f:
                f.write(f"{epoch},{loss}\n")
            if self.local_rank == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)


def main(save_every, total_epochs, batch_size, snapshot_path="snapshot.pt"):
    init_process_group(backend="gloo")
    model = torch.nn.Linear(20, 1)
    dataset = MyTrainDataset(SETTINGS["samples"])
    train_data = DataLoader(dataset, batch_size=batch_size, shuffle=False, sampler=DistributedSampler(dataset))
    trainer = Trainer(model, train_data, torch.optim.SGD(model.parameters(), lr=1e-3), save_every, snapshot_path)
    trainer.train(total_epochs)
    rank = os.environ["RANK"]
    Path(os.environ["DDPCTL_OUTPUT_DIR"], f"done-{rank}.json").write_text(json.dumps({"rank": int(rank)}))
    if os.environ["LOCAL_RANK"] == "0":
        Path("scratch.bin").write_bytes(os.urandom(70_000))  # a big scratch file, in real life
        with open("notes.txt", "a") as f:  # a shipped file the script changes
            f.write(f"trained on {os.environ['GROUP_RANK']}\n")
        if not os.path.lexists("latest.pt"):
            os.symlink("snapshot.pt", "latest.pt")
    del trainer
    gc.collect()  # torch 2.13, gloo: a DDP model alive as the interpreter ends aborts it (SIGABRT)
    destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
'''
SHIPPED = {"ddp/multinode.py", "ddp/settings.json", "notes.txt", ".gitignore"}
BIG_DATA = 1_200_000  # bytes in the ignored data folder


@dataclass
class TutorialRun:
    bed: Testbed
    project: Path
    runs: Path
    run: Path
    result: subprocess.CompletedProcess[str]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def host_files(host: TestHost, directory: str) -> dict[str, str]:
    """relative path -> sha256 of the regular files under a directory on the host (links left out)."""
    script = ("import hashlib, os, sys, json\nroot = sys.argv[1]\nout = {}\n"
              "for top, dirs, files in os.walk(root):\n"
              "    for n in files:\n"
              "        p = os.path.join(top, n)\n"
              "        if os.path.isfile(p) and not os.path.islink(p):\n"
              "            out[os.path.relpath(p, root)] = hashlib.sha256(open(p, 'rb').read()).hexdigest()\n"
              "print(json.dumps(out))\n")
    return json.loads(host.run_as_user(["python3", "-c", script, f"{host.home}/{directory}"]).stdout)


def local_files(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): sha256(p) for p in sorted(directory.rglob("*"))
            if p.is_file() and not p.is_symlink()}


def make_project(root: Path) -> Path:
    project = root / "project"
    (project / "ddp").mkdir(parents=True)
    (project / "ddp" / "multinode.py").write_text(TUTORIAL)
    (project / "ddp" / "settings.json").write_text(json.dumps({"samples": 256}))
    (project / "notes.txt").write_text("notes\n")
    (project / ".gitignore").write_text("data/\n")
    (project / "data").mkdir()
    (project / "data" / "big.bin").write_bytes(b"\0" * BIG_DATA)
    return project


@pytest.fixture(scope="module")
def python3_only_bed(two_hosts: Testbed) -> Iterator[Testbed]:
    """Two hosts whose logins find this machine's python (with torch) as `python3` and have no `python`."""
    bed = two_hosts
    only = Path("/opt/ddpctl-testbed") / f"python3-only-{secrets.token_hex(4)}"
    try:
        only.mkdir(mode=0o755)
        env = bed.hosts[0].ssh_environment()
        interpreter = Path(env["PATH"].split(":")[0]) / "python3"
        # A wrapper, as pyenv's shims are: a symlink would hide the virtual environment that this machine's python
        # may be (python finds its pyvenv.cfg beside the path it was started by, not beside the link's target).
        (only / "python3").write_text(f'#!/bin/sh\nexec {shlex.quote(str(interpreter))} "$@"\n')
        (only / "python3").chmod(0o755)
        for host in bed.hosts:
            host.update_ssh_environment({"PATH": f"{only}:/usr/local/bin:/usr/bin:/bin"})
        yield from lent(bed)  # the hosts' PATH back as the bed made it
    finally:
        shutil.rmtree(only, ignore_errors=True)


def hosts_of(bed: Testbed) -> list[str]:
    return [arg for host in bed.hosts for arg in ("--host", host.spec)]


def run_tutorial(bed: Testbed, root: Path, *extra: str, gpus: int) -> TutorialRun:
    project = make_project(root)
    runs = root / "runs"
    result = run_ddpctl(bed, "up", *hosts_of(bed), "--gpus", str(gpus), "--runs-dir", str(runs), *extra,
                        "--", "python", "ddp/multinode.py", "1", "2", "32", cwd=project, timeout=300)
    assert result.returncode == 0, result.stderr
    (run,) = [p for p in runs.iterdir() if p.is_dir()]
    return TutorialRun(bed, project, runs, run, result)


@pytest.fixture(scope="module")
def tutorial(python3_only_bed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> TutorialRun:
    """One run of the tutorial script on both hosts, one process each, 2 epochs, a snapshot every epoch."""
    return run_tutorial(python3_only_bed, tmp_path_factory.mktemp("tutorial"), gpus=1)


def workdir_on(run: Path) -> str:
    """The script's working directory on a host, relative to the login's home."""
    return f".ddpctl/runs/{run.name}/code"


def test_python_means_the_nodes_interpreter_on_a_host_without_python(tutorial: TutorialRun) -> None:
    for host in tutorial.bed.hosts:
        with connect(tutorial.bed, host) as conn:
            assert conn.run(["sh", "-c", "command -v python"]).exit_code != 0  # only python3 is there
            assert conn.run(["sh", "-c", "command -v python3"]).exit_code == 0
    events = [json.loads(line) for line in (tutorial.run / "events.jsonl").read_text().splitlines()]
    assert [e["exit_codes"] for e in events if e["event"] == "finished"] == [[0, 0]]


def test_every_file_the_script_wrote_comes_back_from_every_node_verified(tutorial: TutorialRun) -> None:
    ranks_seen = []
    for index, host in enumerate(tutorial.bed.hosts):
        on_host = host_files(host, workdir_on(tutorial.run))
        shipped_now = {rel for rel in SHIPPED if rel != "notes.txt"}
        written = {rel: sha for rel, sha in on_host.items() if rel not in shipped_now and "__pycache__" not in rel}
        pulled = local_files(tutorial.run / "nodes" / str(index) / "workdir")
        assert pulled == written  # the same files, sha256 equal to the host's
        assert {"snapshot.pt", "scratch.bin", "notes.txt"} <= set(pulled)
        assert not (set(pulled) & shipped_now)  # the shipped files, unchanged, stay there
        ranks_seen += sorted(rel for rel in pulled if rel.startswith("metrics/"))
        snapshot = (tutorial.run / "nodes" / str(index) / "workdir" / "snapshot.pt").read_bytes()
        assert snapshot[:2] == b"PK"  # a torch.save zip
        notes = (tutorial.run / "nodes" / str(index) / "workdir" / "notes.txt").read_text()
        assert notes.startswith("notes\ntrained on ")  # changed after shipping: an output
    assert sorted(ranks_seen) == [f"metrics/rank-{r}.csv" for r in range(2)]


def test_output_folder_and_rank_0s_copy_at_the_top(tutorial: TutorialRun) -> None:
    done = {}
    for index in (0, 1):
        out = tutorial.run / "nodes" / str(index) / "out"
        done[index] = sorted(p.name for p in out.glob("done-*.json"))
    assert sorted(done[0] + done[1]) == [f"done-{r}.json" for r in range(2)]
    rank0 = next(k for k in (0, 1) if "done-0.json" in done[k])
    assert local_files(tutorial.run / "workdir") == local_files(tutorial.run / "nodes" / str(rank0) / "workdir")
    assert (tutorial.run / "workdir" / "metrics" / "rank-0.csv").is_file()
    assert sorted(p.name for p in (tutorial.run / "out").glob("done-*.json")) == done[rank0]


def test_a_symlink_the_script_made_is_named_not_followed(tutorial: TutorialRun) -> None:
    assert "symbolic links are not pulled (never followed): workdir/latest.pt" in tutorial.result.stderr
    for index in (0, 1):
        assert not os.path.lexists(tutorial.run / "nodes" / str(index) / "workdir" / "latest.pt")


def test_the_shipping_note_names_the_ignored_data_folder_once(tutorial: TutorialRun) -> None:
    lines = [line for line in unstamped(tutorial.result.stderr).splitlines() if line.startswith("shipping ")]
    assert len(lines) == 1, tutorial.result.stderr  # once per run, not per node
    shipped_bytes = sum((tutorial.project / rel).stat().st_size for rel in SHIPPED)
    assert lines[0].startswith(f"shipping 4 files ({shipped_bytes / 1e3:.1f} kB) of {tutorial.project} to each node")
    assert "left out by .gitignore/.ddpctlignore: data/ (1 file, 1.2 MB)" in lines[0]
    assert "`!data/`" in lines[0]
    assert json.loads((tutorial.run / "shipped.json").read_text())["files"].keys() == SHIPPED


def test_a_second_pull_moves_nothing(tutorial: TutorialRun) -> None:
    before = local_files(tutorial.run)
    again = run_ddpctl(tutorial.bed, "pull", str(tutorial.run))
    assert again.returncode == 0, again.stderr
    assert "pulled 0 bytes" in again.stderr
    events = [json.loads(line) for line in (tutorial.run / "events.jsonl").read_text().splitlines()]
    last = [e for e in events if e["event"] == "pulled"][-2:]
    assert [e["files_fetched"] for e in last] == [0, 0] and all(e["workdir"]["files_unchanged"] > 0 for e in last)
    assert local_files(tutorial.run).keys() >= before.keys()


def test_outputs_narrows_what_comes_back(python3_only_bed: Testbed, tmp_path: Path) -> None:
    narrowed = run_tutorial(python3_only_bed, tmp_path, "--outputs", "snapshot.pt", "--outputs", "metrics/", gpus=1)
    assert json.loads((narrowed.run / "run.json").read_text())["options"]["outputs"] == ["snapshot.pt", "metrics/"]
    for index in (0, 1):
        pulled = set(local_files(narrowed.run / "nodes" / str(index) / "workdir"))
        assert "snapshot.pt" in pulled and all(rel == "snapshot.pt" or rel.startswith("metrics/") for rel in pulled)
        assert list((narrowed.run / "nodes" / str(index) / "out").glob("done-*.json"))  # the output folder: whole
    # `ddpctl down` pulls too, narrowed the same way (from run.json): what was lost here comes back, scratch.bin not.
    shutil.rmtree(narrowed.run / "nodes" / "0" / "workdir")
    down = run_ddpctl(python3_only_bed, "down", str(narrowed.run))
    assert down.returncode == 0, down.stderr
    assert (narrowed.run / "nodes" / "0" / "workdir" / "snapshot.pt").is_file()
    assert not list(narrowed.run.glob("nodes/*/workdir/scratch.bin"))


# -- locally (no --host): the script runs in the user's directory; the run directory says what it wrote ----------

LOCAL_SCRIPT = """
import os
from pathlib import Path
rank = os.environ["RANK"]
Path("checkpoints").mkdir(exist_ok=True)
Path(f"checkpoints/rank-{rank}.pt").write_bytes(rank.encode() * 1000)
Path(os.environ["DDPCTL_OUTPUT_DIR"], f"done-{rank}.txt").write_text(rank)
"""


def local_ddpctl(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True, timeout=300,
                          env=env, cwd=cwd)


def test_a_local_script_writes_in_place_and_the_run_directory_lists_it(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(LOCAL_SCRIPT)
    (tmp_path / "untouched.txt").write_text("x")
    result = local_ddpctl(tmp_path, "up", "--gpus", "2", "--", "python", "train.py")
    assert result.returncode == 0, result.stderr
    (run,) = list((tmp_path / "runs").iterdir())
    assert sorted(p.name for p in (run / "out").iterdir()) == ["done-0.txt", "done-1.txt"]
    listed = json.loads((run / "workdir.json").read_text())
    assert listed["workdir"] == str(tmp_path.resolve())
    assert listed["files"] == [{"path": f"checkpoints/rank-{r}.pt", "size": 1000,
                                "sha256": sha256(tmp_path / "checkpoints" / f"rank-{r}.pt")} for r in (0, 1)]


def test_outputs_is_refused_where_nothing_comes_back(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    local = local_ddpctl(tmp_path, "up", "--outputs", "*.pt", "--", "python", "train.py")
    assert local.returncode != 0 and local.stderr.strip().splitlines()[-1].startswith("error: --outputs has no effect")
    trainer = local_ddpctl(tmp_path, "up", "--host", "h", "--outputs", "*.pt", "--dry-run", "--no-probe")
    assert trainer.returncode != 0
    assert trainer.stderr.strip().splitlines()[-1].startswith("error: --outputs narrows what comes back")
    assert not (tmp_path / "runs").exists()
