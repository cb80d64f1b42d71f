"""`up --provider vast --interruptible` end to end: the stand-in's market outbids node 0's machine of a 2-node run
while it trains (its processes end, its SSH port closes, the API shows it stopped with intended_status running);
ddpctl rents a new set in the same cluster, puts the newest snapshot on it, resumes every rank and finishes, as
one run, with every epoch trained once. Real test-bed SSH hosts, real torchrun with gloo."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra import vast_bids
from infra.testbed import Testbed, cleanup_stale
from infra.vast_standin import VastStandIn, make_offer
from launcher.places.vast.ledger import instance_cost
from tests.test_vast_up import DISK, IMAGE, KEY, Launcher
from tests.testbed_fixtures import needs_testbed

pytestmark = [needs_testbed, pytest.mark.testbed]


@pytest.fixture(scope="module")
def bed() -> Iterator[Testbed]:
    cleanup_stale("ddpbid")
    with Testbed("ddpbid", n_hosts=0, host_python=True) as testbed:
        yield testbed


@pytest.fixture
def standin(bed: Testbed) -> Iterator[VastStandIn]:
    offers = [make_offer(k, 400 + k, dph_base=0.10 + 0.01 * k, cluster_id=9) for k in range(1, 5)]
    with VastStandIn(api_key=KEY, offers=offers, host_factory=lambda _iid: bed.add_host(22),
                     host_remover=bed.remove_host, boot_delay_s=0.2) as s:
        yield s
        assert s.validation_failures() == []
    for host in list(bed.hosts):
        bed.remove_host(host)


def _run_dir(runs: Path) -> Path | None:
    """The run's directory once it has its name (it is made under a hidden temporary name, then renamed)."""
    found = [p for p in runs.iterdir() if p.is_dir() and not p.name.startswith(".")] if runs.is_dir() else []
    return found[0] if found else None


def _wait_for(check, timeout: float, what: str, proc: subprocess.Popen[str]):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        if proc.poll() is not None:
            raise AssertionError(f"up ended before {what}: {proc.communicate()}")
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"no {what} within {timeout}s: {proc.communicate()}")


def test_an_outbid_node_is_replaced_and_every_rank_resumes_from_the_pulled_snapshot(bed, standin, tmp_path) -> None:
    ddpctl = Launcher(tmp_path, standin)
    # Epochs of about 3 s so that the outbid lands mid-run (after epoch 1's snapshot is pulled, well before epoch 4
    # ends): 16 steps a rank, each followed by a 0.2 s pause, instead of 512 steps trained flat out. The ranks keep
    # stepping, snapshotting and reporting progress as before; they sleep through most of each epoch.
    argv = ddpctl.argv("up", "--provider", "vast", "--image", IMAGE, "--disk", str(DISK), "--runs-dir",
                       str(ddpctl.runs), "--nodes", "2", "--gpus", "1", "--gpu-name", "RTX 3080", "--interruptible",
                       "--down", "--json", "--epochs", "4", "--synthetic-train-size", "1024",
                       "--synthetic-test-size", "128", "--batch-size", "32", "--trainer-arg=--step-pause=0.2")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ddpctl.env())
    try:
        run = _wait_for(lambda: _run_dir(ddpctl.runs), 120, "run directory", proc)
        _wait_for(lambda: list((run / "live" / "0" / "out" / "snapshots").glob("snapshot-epoch-*.pt")), 240,
                  "live-pulled snapshot", proc)
        record = json.loads((run / "run.json").read_text())
        node0 = next(i for i in record["instances"] if i["node"] == 0 and i["state"] == "rented")
        assert vast_bids.outbid(standin, int(node0["machine_id"]), 5.0) == [node0["instance_id"]]
        stdout, stderr = proc.communicate(timeout=420)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    assert "left running" not in stderr and "reattach" not in stderr  # the outbid machine is replaced, not left
    out = json.loads(stdout)
    summary = out["summary"]
    assert summary["interruptions"] == 1 and summary["epochs"] == 4 and summary["world_size"] == 2
    assert standin.live_instances() == [] and bed.hosts == [] and standin.overlays == {}

    record = json.loads((run / "run.json").read_text())
    (entry,) = record["interruptions"]
    assert entry["lost"]["0"]["instance_id"] == node0["instance_id"]
    assert entry["lost"]["0"]["actual_status"] == "stopped" and entry["lost"]["0"]["intended_status"] == "running"
    assert "outbid" in entry["lost"]["0"]["reason"]
    resumed = entry["resumed_epoch"]
    assert 1 <= resumed < 4 and entry["measured_to"] == "a training step after resuming"
    assert 0 < entry["seconds_to_training"] < 300
    assert entry["cost_usd"] == pytest.approx(entry["gap_usd"] + entry["redone_usd"]) and entry["gap_usd"] > 0
    # every epoch trained once: epochs up to the snapshot on the first set (before the loss), the rest after it
    epochs = [json.loads(line) for line in (run / "timing.jsonl").read_text().splitlines()]
    assert [e["epoch"] for e in epochs] == [1, 2, 3, 4]
    assert all(e["time"] < entry["detected_at"] for e in epochs[:resumed])
    assert all(e["time"] > entry["detected_at"] for e in epochs[resumed:])
    said = [p for p in (run / "nodes" / "0").rglob("*") if p.is_file() and p.suffix != ".pt"
            and f"resuming after epoch {resumed} from" in p.read_text(errors="replace")]
    assert said, "the resumed trainer does not say what it resumed from"
    # one run: four instances in its ledger (two sets), all destroyed; the cost is what they billed
    instances = record["instances"]
    assert len(instances) == 4 and {i["state"] for i in instances} == {"destroyed"} and record["released_at"]
    lost = next(i for i in instances if i["instance_id"] == node0["instance_id"])
    assert lost["stops"] and lost["bid"] == pytest.approx(0.055)  # offer 1: min_bid 0.044, +25%
    assert record["cost_usd"] == pytest.approx(sum(instance_cost(i, 0) for i in instances), abs=1e-6)
    assert summary["cost_usd"] == pytest.approx(record["cost_usd"])
    assert "interruption 1:" in stderr and "bidding $" in stderr
    ddpctl.outputs += [stdout, stderr]
    # one run in `status` and in the report, with its interruption
    status = ddpctl("status", run.name, "--runs-dir", str(ddpctl.runs))
    assert status.returncode == 0 and f"interruption 1: node 0 (vast:{node0['instance_id']}" in status.stdout
    report = ddpctl("report", str(run), "--out", str(tmp_path / "report"))
    assert report.returncode == 0, report.stderr
    told = (tmp_path / "report" / "report.md").read_text()
    assert "## Interruptions" in told and f"`{run.name}` interruption 1: node 0" in told
    ddpctl.assert_key_nowhere()


CHECKPOINTING_SCRIPT = '''
import json, os, time
import torch
import torch.distributed as dist

STEPS = 10
dist.init_process_group("gloo")
out = os.environ["DDPCTL_OUTPUT_DIR"]
path = os.path.join(out, "ckpt.json")
saved = json.load(open(path)) if os.path.exists(path) else {"step": 0, "trained": [], "resumed_from": []}
start = torch.tensor([saved["step"]])
dist.all_reduce(start, op=dist.ReduceOp.MIN)  # every rank resumes from the step all of them have
step = int(start)
trained = [s for s in saved["trained"] if s <= step]
resumed_from = saved["resumed_from"] + ([step] if os.path.exists(path) else [])
while step < STEPS:
    total = torch.ones(1)
    dist.all_reduce(total)
    time.sleep(1.5)
    step += 1
    trained.append(step)
    if int(os.environ["LOCAL_RANK"]) == 0:  # one copy per node, written whole then renamed
        with open(path + ".tmp", "w") as fh:
            json.dump({"step": step, "trained": trained, "resumed_from": resumed_from}, fh)
        os.replace(path + ".tmp", path)
dist.destroy_process_group()
'''


def test_a_script_resumes_from_its_own_checkpoint_in_its_output_folder(bed, standin, tmp_path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(CHECKPOINTING_SCRIPT)
    ddpctl = Launcher(tmp_path, standin)
    argv = ddpctl.argv("up", "--provider", "vast", "--image", IMAGE, "--disk", str(DISK), "--runs-dir",
                       str(ddpctl.runs), "--nodes", "2", "--gpus", "1", "--gpu-name", "RTX 3080", "--interruptible",
                       "--down", "--json", "--", "python3", "train.py")
    env = {**ddpctl.env(), "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}  # this checkout's ddpctl
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=project)
    try:
        run = _wait_for(lambda: _run_dir(ddpctl.runs), 120, "run directory", proc)

        def checkpointed() -> bool:
            try:
                return json.loads((run / "live" / "0" / "out" / "ckpt.json").read_text())["step"] >= 2
            except (OSError, ValueError):
                return False

        _wait_for(checkpointed, 240, "live-pulled checkpoint", proc)
        record = json.loads((run / "run.json").read_text())
        node0 = next(i for i in record["instances"] if i["node"] == 0 and i["state"] == "rented")
        vast_bids.outbid(standin, int(node0["machine_id"]), 5.0)
        stdout, stderr = proc.communicate(timeout=420)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    record = json.loads((run / "run.json").read_text())
    (entry,) = record["interruptions"]
    assert entry["measured_to"] == "the nodes started again" and entry["resumed_epoch"] is None
    assert standin.live_instances() == [] and bed.hosts == []
    for node in (0, 1):
        ckpt = json.loads((run / "nodes" / str(node) / "out" / "ckpt.json").read_text())
        # resumed once, from a step it had checkpointed (not from the start); every step trained once
        assert len(ckpt["resumed_from"]) == 1 and ckpt["resumed_from"][0] >= 2, ckpt
        assert ckpt["trained"] == list(range(1, 11)), ckpt
