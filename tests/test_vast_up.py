"""`ddpctl up --provider vast` end to end: the Vast.ai stand-in (real HTTP, the official contract) whose instances
are real test-bed SSH hosts (netns + sshd, this machine's python and torch), the real launcher as a process,
real torchrun with gloo. Every launcher run records each remote command line, so the API key can be looked for
in everything: output, run directory, config files, requests' bodies, remote commands."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.testbed import Testbed, cleanup_stale
from infra.vast_standin import VastStandIn, make_offer
from launcher.results.rundir import RunDir
from tests.testbed_fixtures import needs_testbed

pytestmark = [needs_testbed, pytest.mark.testbed]
KEY = "sk-vastup-5e3c7a91d2f04b6e88"
IMAGE = "docker.io/ddpctl/trainer:test"
DISK = 16
SMALL = ["--synthetic-train-size", "512", "--synthetic-test-size", "128", "--batch-size", "32"]
STORAGE = 0.15 * DISK / 720  # $/hour for the disk (make_offer's storage_cost)

# Runs the launcher with every remote command line (Connection.run / run_shell / channels) appended to a file.
RECORDING_LAUNCHER = r"""
import sys
import launcher.transport.ssh as ssh
log = open(sys.argv[1], "a")
quote = ssh.command_line
def command_line(argv, **kw):
    line = quote(argv, **kw)
    log.write(line + "\n"); log.flush()
    return line
ssh.command_line = command_line
shell = ssh.Connection.run_shell
def run_shell(self, script, **kw):
    log.write(script + "\n"); log.flush()
    return shell(self, script, **kw)
ssh.Connection.run_shell = run_shell
from launcher.cli.app import main
main(sys.argv[2:])
"""


@pytest.fixture(scope="module")
def bed() -> Iterator[Testbed]:
    """No hosts at first: the stand-in makes one per instance created and removes it on destroy."""
    cleanup_stale("ddpvast")
    with Testbed("ddpvast", n_hosts=0, host_python=True) as testbed:
        yield testbed


@pytest.fixture
def standin(bed: Testbed) -> Iterator[VastStandIn]:
    offers = [make_offer(1, 401, dph_base=0.10, cluster_id=9), make_offer(2, 402, dph_base=0.12, cluster_id=9),
              make_offer(3, 403, dph_base=0.15, cluster_id=9),
              make_offer(4, 404, dph_base=0.50, gpu_name="A100", num_gpus=8),
              make_offer(5, 405, dph_base=36.0, gpu_name="H100"),
              make_offer(6, 406, gpu_name="RTX 4090"), make_offer(7, 407, gpu_name="RTX 4090"),
              make_offer(8, 408, dph_base=0.30, num_gpus=2)]  # two ranks on one machine: the places' contract
    with VastStandIn(api_key=KEY, offers=offers, host_factory=lambda _iid: bed.add_host(22),
                     host_remover=bed.remove_host, boot_delay_s=0.2) as s:
        yield s
        assert s.validation_failures() == []
    for host in list(bed.hosts):  # a failed test must not leave hosts to the next one
        bed.remove_host(host)


class Launcher:
    """Runs ddpctl as its own process against the stand-in; keeps every output for the key scan."""

    def __init__(self, tmp: Path, standin: VastStandIn) -> None:
        self.tmp, self.standin = tmp, standin
        self.runs = tmp / "runs"
        self.commands = tmp / "remote-commands.log"
        self.outputs: list[str] = []

    def env(self, key: str | None = KEY) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "VAST_API_KEY"}
        env.update(DDPCTL_VAST_URL=self.standin.url, XDG_CONFIG_HOME=str(self.tmp / "config"),
                   HOME=str(self.tmp / "home"), DDPCTL_KNOWN_HOSTS=str(self.tmp / "known_hosts"))
        if key is not None:
            env["VAST_API_KEY"] = key
        return env

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-c", RECORDING_LAUNCHER, str(self.commands), *args]

    def __call__(self, *args: str, key: str | None = KEY, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(self.argv(*args), capture_output=True, text=True, timeout=timeout,
                                env=self.env(key))
        self.outputs += [result.stdout, result.stderr]
        return result

    def up(self, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
        return self("up", "--provider", "vast", "--image", IMAGE, "--disk", str(DISK), "--runs-dir", str(self.runs),
                    "--epochs", "2", *SMALL, *args, **kw)  # type: ignore[arg-type]

    def assert_key_nowhere(self) -> None:
        """The API key is in no output, no file the launcher wrote, no request body, no remote command."""
        texts = {f"output {i}": t for i, t in enumerate(self.outputs)}
        texts["stand-in requests"] = json.dumps(self.standin.requests)
        for root in (self.tmp,):
            for path in root.rglob("*"):
                if path.is_file():
                    texts[str(path)] = path.read_bytes().decode(errors="replace")
        assert self.commands.exists() and self.commands.read_text().strip(), "no remote command was recorded"
        assert [where for where, text in texts.items() if KEY in text] == []


@pytest.fixture
def ddpctl(tmp_path: Path, standin: VastStandIn) -> Launcher:
    return Launcher(tmp_path, standin)


def _record(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())


def _events(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


def _the_run(runs: Path) -> Path:
    (run,) = [p for p in runs.iterdir() if p.is_dir()]
    return run


def _expected_cost(record: dict) -> float:
    return sum(i["dph"] * (i["destroyed_at"] - i["created_at"]) / 3600 for i in record["instances"])


def test_two_nodes_train_pull_verify_and_tear_down(bed, standin, ddpctl) -> None:
    result = ddpctl.up("--nodes", "2", "--gpus", "1", "--gpu-name", "RTX 3080", "--down", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    summary, run = out["summary"], Path(out["run_dir"])
    assert summary["world_size"] == 2 and summary["nnodes"] == 2 and summary["epochs"] == 2
    assert standin.live_instances() == [] and bed.hosts == [] and standin.overlays == {}

    record = _record(run)
    assert record["provider"] == "vast" and record["runtime"] == "native" and record["released_at"]
    assert [i["state"] for i in record["instances"]] == ["destroyed", "destroyed"]
    assert [i["machine_id"] for i in record["instances"]] == [401, 402]  # the two cheapest in cluster 9
    assert [i["dph"] for i in record["instances"]] == pytest.approx([0.10 + STORAGE, 0.12 + STORAGE])
    # node addresses are the overlay addresses found over SSH (the API reports only the subnet)
    overlay_ips = [i["overlay_ip"] for i in record["instances"]]
    assert [n["address"] for n in record["nodes"]] == overlay_ips and all(overlay_ips)
    assert record["cost_usd"] == pytest.approx(_expected_cost(record), abs=1e-6) and record["cost_usd"] > 0
    assert json.loads((run / "summary.json").read_text())["cost_usd"] == pytest.approx(record["cost_usd"])
    assert summary["cost_usd"] == pytest.approx(record["cost_usd"])

    events = _events(run)
    kinds = [e["event"] for e in events]
    assert kinds.count("vast.instance_created") == 2 and kinds.count("pulled") == 2
    destroyed = [e for e in events if e["event"] == "vast.instance_destroyed"]
    assert [e["reason"] for e in destroyed] == ["up --down", "up --down"]
    assert max(i for i, k in enumerate(kinds) if k == "pulled") < kinds.index("vast.instance_destroyed")
    for k in range(2):
        node = run / "nodes" / str(k)
        assert (node / "exit_code").read_text().strip() == "0" and list((node / "out" / "snapshots").iterdir())
    # trust on first use, for these two new instances only: their keys are in the run's own file
    assert len((run / "known_hosts").read_text().splitlines()) == 2
    assert "KEEP BILLING" not in result.stderr
    ddpctl.assert_key_nowhere()


def test_left_running_status_lists_it_down_names_what_it_cannot_pull_then_destroys(bed, standin, ddpctl) -> None:
    result = ddpctl.up("--gpus", "1", "--gpu-name", "RTX 3080")
    assert result.returncode == 0, result.stderr
    run = _the_run(ddpctl.runs)
    assert "KEEP BILLING" in result.stderr and f"ddpctl down {run.name}" in result.stderr
    assert len(standin.live_instances()) == 1 and len(bed.hosts) == 1
    assert "cost" in result.stderr  # the summary table's cost row

    rented = ddpctl("status", "--rented", "--json", "--runs-dir", str(ddpctl.runs))
    assert rented.returncode == 0, rented.stderr
    [row] = json.loads(rented.stdout)["rented"]
    assert row["run"] == run.name and row["instance_id"] == standin.live_instances()[0] and row["cost_usd"] > 0
    plain = ddpctl("status", run.name, "--runs-dir", str(ddpctl.runs))
    assert plain.returncode == 0 and "still rented" in plain.stderr

    # The host key recorded on first use is required later: a different one is refused.
    known = run / "known_hosts"
    original = known.read_text()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ddpctl.tmp / "other")], check=True)
    keytype, other_key = (ddpctl.tmp / "other.pub").read_text().split()[:2]
    known.write_text(f"{original.split()[0]} {keytype} {other_key}\n")
    changed = ddpctl("pull", run.name, "--runs-dir", str(ddpctl.runs))
    assert changed.returncode == 1 and "HOST KEY CHANGED" in changed.stderr
    known.write_text(original)

    # A file the host cannot read is named, not a reason to keep billing: everything else comes back verified,
    # then the machine (and that file with it) is destroyed, as the line says.
    unreadable = f"{bed.hosts[0].home}/.ddpctl/runs/{run.name}/out/x"
    bed.hosts[0].run_as_user(["sh", "-c", 'echo secret > "$1" && chmod 000 "$1"', "sh", unreadable])
    down = ddpctl("down", run.name, "--runs-dir", str(ddpctl.runs))
    assert down.returncode == 0, down.stderr
    assert "pull incomplete, 1 file not pulled: node 0 'out/x'" in down.stderr, down.stderr
    assert "gone with the machines" in down.stderr
    pulled = json.loads((run / "pull.json").read_text())
    assert [item["path"] for n in pulled["nodes"] for item in n["not_pulled"]] == ["out/x"]
    assert not [p for p in run.rglob("x") if p.is_file()] and "secret" not in down.stderr
    assert standin.live_instances() == [] and bed.hosts == []
    kinds = [e["event"] for e in _events(run)]
    assert kinds.index("vast.instance_destroyed") > max(i for i, k in enumerate(kinds) if k == "pulled")
    record = _record(run)
    assert record["released_at"] and record["cost_usd"] == pytest.approx(_expected_cost(record), abs=1e-6)
    assert json.loads((run / "summary.json").read_text())["cost_usd"] == pytest.approx(record["cost_usd"])
    after = ddpctl("status", "--rented", "--json", "--runs-dir", str(ddpctl.runs))
    assert json.loads(after.stdout)["rented"] == []
    again = ddpctl("down", run.name, "--runs-dir", str(ddpctl.runs))
    assert again.returncode == 0 and "no rented machine" in again.stderr
    status = ddpctl("status", run.name, "--json", "--runs-dir", str(ddpctl.runs))  # asks no destroyed machine
    assert [(n["state"], n["exit_code"]) for n in json.loads(status.stdout)["nodes"]] == [("machine destroyed", 0)]
    ddpctl.assert_key_nowhere()


def _signal_while_renting(standin: VastStandIn, ddpctl: Launcher, signum: int) -> tuple[int, str, str]:
    """Start `up` on an offer whose machine never finishes loading; once the instance exists and run.json
    names it, send `signum` to the launcher."""
    standin.faults.stuck_machines.add(401)
    proc = subprocess.Popen(ddpctl.argv("up", "--provider", "vast", "--image", IMAGE, "--disk", str(DISK),
                                        "--gpu-name", "RTX 3080", "--gpus", "1", "--ready-timeout", "120",
                                        "--runs-dir", str(ddpctl.runs)),
                            env=ddpctl.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            runs = list(ddpctl.runs.glob("*/run.json")) if ddpctl.runs.exists() else []
            if standin.live_instances() and runs and json.loads(runs[0].read_text()).get("instances"):
                break
            time.sleep(0.1)
        assert standin.live_instances(), "no instance was created"
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    ddpctl.outputs += [stdout, stderr]
    return proc.returncode, stdout, stderr


def test_ctrl_c_while_renting_leaves_nothing_rented(bed, standin, ddpctl) -> None:
    returncode, _, stderr = _signal_while_renting(standin, ddpctl, signal.SIGINT)
    assert returncode == 130, stderr
    assert "Ctrl-C" in stderr and "destroyed" in stderr
    assert standin.live_instances() == [] and bed.hosts == []
    run = _the_run(ddpctl.runs)
    assert [i["state"] for i in _record(run)["instances"]] == ["destroyed"]
    assert "vast.instance_destroyed" in [e["event"] for e in _events(run)]


def test_ctrl_c_while_training_stops_pulls_and_destroys(bed, standin, ddpctl) -> None:
    proc = subprocess.Popen(ddpctl.argv("up", "--provider", "vast", "--image", IMAGE, "--disk", str(DISK),
                                        "--gpu-name", "RTX 3080", "--gpus", "1", "--epochs", "200", *SMALL,
                                        "--runs-dir", str(ddpctl.runs)),
                            env=ddpctl.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # training is under way on the node
            if ddpctl.runs.exists() and any('"started"' in p.read_text() for p in ddpctl.runs.glob("*/events.jsonl")):
                break
            time.sleep(0.2)
        time.sleep(2)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    ddpctl.outputs += [stdout, stderr]
    assert proc.returncode == 130, stderr
    assert standin.live_instances() == [] and bed.hosts == []
    run = _the_run(ddpctl.runs)
    kinds = [e["event"] for e in _events(run)]
    assert kinds.index("interrupted") < kinds.index("pulled") < kinds.index("vast.instance_destroyed")
    assert (run / "nodes" / "0" / "torchrun.out").exists() and _record(run)["released_at"]
    ddpctl.assert_key_nowhere()


def test_launcher_killed_while_renting_then_down_finds_and_destroys_the_instance(bed, standin, ddpctl) -> None:
    returncode, _, _ = _signal_while_renting(standin, ddpctl, signal.SIGKILL)  # no cleanup can run
    assert returncode == -signal.SIGKILL and len(standin.live_instances()) == 1
    run = _the_run(ddpctl.runs)
    rented = ddpctl("status", "--rented", "--json", "--runs-dir", str(ddpctl.runs))
    assert [r["instance_id"] for r in json.loads(rented.stdout)["rented"]] == standin.live_instances()
    down = ddpctl("down", run.name, "--runs-dir", str(ddpctl.runs))  # nothing was started: nothing to pull
    assert down.returncode == 0, down.stderr
    assert standin.live_instances() == [] and bed.hosts == []
    assert _record(run)["released_at"]


def test_failure_after_provisioning_destroys_what_up_created(bed, standin, ddpctl) -> None:
    # The offer says 8 GPUs; the machine behind it (a test-bed host) has 2 CPU cores: preflight refuses.
    result = ddpctl.up("--gpus", "8", "--gpu-name", "A100")
    assert result.returncode == 1
    assert "preflight failed" in result.stderr and "--gpus 8" in result.stderr
    assert "destroyed" in result.stderr and "Traceback" not in result.stderr
    assert standin.live_instances() == [] and bed.hosts == [] and len(standin.instances) == 1
    run = _the_run(ddpctl.runs)
    record = _record(run)
    assert [i["state"] for i in record["instances"]] == ["destroyed"] and record["released_at"]
    events = _events(run)
    assert [e["reason"] for e in events if e["event"] == "vast.instance_destroyed"] == ["up failed"]
    ddpctl.assert_key_nowhere()


def test_max_cost_stops_pulls_and_tears_down_before_the_budget_passes(bed, standin, ddpctl) -> None:
    # $36/hour is a cent a second. With 10 s of spend kept for stopping, pulling and destroying, the run is
    # stopped about 25 s after the machine was created, mid-training (100,000 epochs take hours on any machine).
    # What stops it is the spend, not the training: each step is followed by a 0.1 s pause (an epoch of 16 steps
    # takes about 2 s), so the rank keeps training and snapshotting while it waits for the budget, mostly asleep.
    max_cost = 0.35
    result = ddpctl.up("--gpus", "1", "--gpu-name", "H100", "--epochs", "100000", "--save-every", "5",
                       "--max-cost", str(max_cost), "--max-cost-reserve", "10", "--trainer-arg=--step-pause=0.1")
    assert result.returncode == 1, result.stderr
    assert "--max-cost" in result.stderr and "destroyed" in result.stderr
    assert standin.live_instances() == [] and bed.hosts == []
    run = _the_run(ddpctl.runs)
    record = _record(run)
    assert 0 < record["cost_usd"] <= max_cost
    assert record["max_cost_reached"]["max_cost"] == max_cost  # run.json (and summary.json) say why it stopped
    assert record["cost_usd"] == pytest.approx(_expected_cost(record), abs=1e-6)
    kinds = [e["event"] for e in _events(run)]
    assert "vast.max_cost_reached" in kinds and "stop_requested" in kinds and "started" in kinds
    assert kinds.index("pulled") < kinds.index("vast.instance_destroyed")
    assert (run / "nodes" / "0" / "torchrun.out").exists()
    assert [e["reason"] for e in _events(run) if e["event"] == "vast.instance_destroyed"] == ["max-cost"]


def test_bad_key_missing_key_no_cluster_and_dry_run_rent_nothing(bed, standin, ddpctl) -> None:
    missing = ddpctl.up("--gpu-name", "RTX 3080", key=None)
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1
    assert missing.stderr.startswith("error: no Vast.ai API key") and "VAST_API_KEY" in missing.stderr

    wrong = "sk-wrong-0000111122223333"
    rejected = ddpctl.up("--gpu-name", "RTX 3080", key=wrong)
    assert rejected.returncode == 1 and rejected.stderr.count("\n") == 1
    assert "rejected the API key" in rejected.stderr and wrong not in rejected.stderr + rejected.stdout

    spread = ddpctl.up("--nodes", "2", "--gpu-name", "RTX 4090")
    assert spread.returncode == 1 and spread.stderr.count("\n") == 1 and "cluster" in spread.stderr

    plan = ddpctl.up("--nodes", "2", "--gpus", "1", "--gpu-name", "RTX 3080", "--dry-run")
    assert plan.returncode == 0, plan.stderr
    assert "vast offer 1" in plan.stdout and "vast offer 2" in plan.stdout and "--nnodes 2" in plan.stdout

    # the budget against the worst case of the expected hours at these offers' prices (issue 42)
    fits = ddpctl.up("--gpus", "1", "--gpu-name", "RTX 3080", "--dry-run", "--max-cost", "50",
                     "--expected-hours", "2")
    assert fits.returncode == 0 and "worst case for --expected-hours 2: $" in fits.stderr, fits.stderr
    assert "against --max-cost $50 (fits)" in fits.stderr
    too_long = ddpctl.up("--gpus", "1", "--gpu-name", "RTX 3080", "--dry-run", "--max-cost", "0.5",
                         "--expected-hours", "200")
    assert too_long.returncode == 1 and too_long.stderr.count("\n") == 1, too_long.stderr
    assert "--max-cost $0.5 does not cover --expected-hours 200" in too_long.stderr

    assert standin.instances == {} and bed.hosts == [] and not ddpctl.runs.exists()
    assert not (ddpctl.tmp / "config" / "ddpctl" / "vast_api_key").exists()
    for text in ddpctl.outputs:
        assert KEY not in text


def test_detached_run_keeps_billing_is_followed_by_status_and_down_ends_it(bed, standin, ddpctl) -> None:
    refused = ddpctl.up("--gpu-name", "RTX 3080", "--detach", "--down")
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1 and "--detach" in refused.stderr
    assert standin.instances == {} and not ddpctl.runs.exists()

    result = ddpctl.up("--gpus", "1", "--gpu-name", "RTX 3080", "--detach")
    assert result.returncode == 0, result.stderr
    run = _the_run(ddpctl.runs)
    assert "KEEP BILLING" in result.stderr and f"ddpctl down {run.name}" in result.stderr
    assert len(standin.live_instances()) == 1
    assert not (run / "summary.json").exists()  # nothing is pulled before the run ends

    deadline = time.monotonic() + 180  # the run goes on without the launcher
    states: list[str] = []
    while time.monotonic() < deadline:
        status = ddpctl("status", run.name, "--json", "--runs-dir", str(ddpctl.runs))
        assert status.returncode == 0, status.stderr
        states = [n["state"] for n in json.loads(status.stdout)["nodes"]]
        if states == ["finished"]:
            break
        time.sleep(2)
    assert states == ["finished"]

    down = ddpctl("down", run.name, "--runs-dir", str(ddpctl.runs))
    assert down.returncode == 0, down.stderr
    assert standin.live_instances() == [] and bed.hosts == []
    assert json.loads((run / "summary.json").read_text())["epochs"] == 2
    assert list((run / "nodes" / "0" / "out" / "snapshots").iterdir())
    record = _record(run)
    assert record["released_at"] and record["cost_usd"] == pytest.approx(_expected_cost(record), abs=1e-6)
    ddpctl.assert_key_nowhere()


def test_a_rented_run_keeps_the_places_contract(standin: VastStandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The contract every place keeps (tests/place_contract.py), on one rented machine of the stand-in (and one more
    for its --stall-timeout run): both destroyed at the end."""
    from launcher.cli.options import LAUNCH_BLOCKS
    from launcher.places.registry import place_named
    from tests.place_contract import VAST_SAYS, keeps_the_contract

    monkeypatch.chdir(tmp_path)
    for name, value in Launcher(tmp_path, standin).env().items():
        monkeypatch.setenv(name, value)
    values = {option.name: option.default for block in LAUNCH_BLOCKS for option in block}
    rent = place_named("vast").requests({**values, "nodes": 1, "disk": DISK})
    keeps_the_contract("vast", tmp_path, capsys, extra={**rent, "image": IMAGE}, said=VAST_SAYS,
                       left_in=rented_workspaces,
                       stall_args=("--provider", "vast", "--gpus", "1", "--gpu-name", "RTX 3080", "--disk", str(DISK),
                                   "--image", IMAGE))
    assert standin.live_instances() == []  # nothing rented any more


def rented_workspaces(run_dir: RunDir) -> list[Path]:
    """Where a rented machine's processes of the run name it: its workspace (`~/.ddpctl/runs/RUN`, whatever the
    machine's home), as a path's tail that any absolute spelling of it holds."""
    from launcher.execute.hosts.node_stops import node_workspaces

    return [Path(workspace.removeprefix("~/")) for workspace in node_workspaces(run_dir)]
