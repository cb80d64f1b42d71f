"""`ddpctl up --host ...` on the real multi-host test bed: sshd in network namespaces, real torchrun with gloo."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from infra.testbed import Testbed, TestHost, cleanup_stale, write_user_file
from tests.testbed_fixtures import TESTBED_SKIP_REASON, TESTBED_UNAVAILABLE, comparable_plan, run_ddpctl

pytestmark = pytest.mark.skipif(TESTBED_UNAVAILABLE, reason=TESTBED_SKIP_REASON)
SMALL = ["--synthetic-train-size", "1024", "--synthetic-test-size", "256"]


@pytest.fixture(scope="module")
def bed() -> Iterator[Testbed]:
    """Three hosts on different ports, each its own login user, with this machine's python and torch."""
    cleanup_stale("ddpup")
    testbed = Testbed("ddpup", n_hosts=3, ports=[22, 2222, 2022], host_python=True)
    try:
        yield testbed
    finally:
        testbed.stop()


ddpctl = run_ddpctl


def host_args(hosts: list[TestHost]) -> list[str]:
    return [arg for h in hosts for arg in ("--host", h.spec)]


def up(bed: Testbed, hosts: list[TestHost], runs: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return ddpctl(bed, "up", *host_args(hosts), "--runs-dir", str(runs), "--epochs", "2", *SMALL, *extra)


def the_run(runs: Path) -> Path:
    (run,) = [p for p in runs.iterdir() if p.is_dir()]
    return run


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def host_sha256(host: TestHost, path: str) -> str:
    out = host.run_as_user(["sha256sum", path]).stdout
    return (out.decode() if isinstance(out, bytes) else out).split()[0]


def test_dry_run_prints_each_node_and_connects_to_nothing(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "launcher", "up", "--dry-run", "--no-probe", "--gpus", "2", "--host",
                             "alice@203.0.113.9:2200", "--host", "bob@198.51.100.7", "--runs-dir", str(tmp_path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "node 0 [alice@203.0.113.9:2200, native]" in result.stdout
    assert "--rdzv-conf is_host=0" in result.stdout and "--node-rank 1" in result.stdout
    assert not any(tmp_path.iterdir())


@dataclass
class PlannedRun:
    """`up --dry-run --json` on the first two hosts, then `up --json` with the same options."""

    planned: dict[str, Any]  # the dry run's plan
    dry_runs: Path  # the dry run's --runs-dir: a dry run records nothing
    result: subprocess.CompletedProcess[str]  # the run's `up`
    run: Path  # its run directory


def planned_run(bed: Testbed, root: Path, *args: str) -> PlannedRun:
    """No --gpus, no --rdzv-port: what only the hosts can tell is left to the probes of the dry run and the run."""
    dry = ddpctl(bed, "up", *host_args(bed.hosts[:2]), "--runs-dir", str(root / "dry"), "--dry-run", "--json", *args)
    assert dry.returncode == 0, dry.stderr
    ran = ddpctl(bed, "up", *host_args(bed.hosts[:2]), "--runs-dir", str(root / "runs"), "--json", *args)
    assert ran.returncode == 0, ran.stderr
    return PlannedRun(json.loads(dry.stdout), root / "dry", ran, the_run(root / "runs"))


@pytest.fixture(scope="module")
def native_run(bed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> PlannedRun:
    """--runtime native, 2 epochs, two processes per host (the probe's choice): read by the plan test and by the
    pull test."""
    return planned_run(bed, tmp_path_factory.mktemp("native"), "--runtime", "native", "--epochs", "2", *SMALL)


@pytest.fixture(scope="module")
def auto_run(bed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> PlannedRun:
    """--runtime auto, 3 epochs, one process per host (--gpus 1: the native run checks the probe's choice of two),
    global rank 1 (node 1's worker) SIGKILLing itself at step 20 (in epoch 2, of 16 steps each) of the first
    attempt, --max-restarts 1: read by the plan test and by the restart test."""
    return planned_run(bed, tmp_path_factory.mktemp("auto"), "--runtime", "auto", "--gpus", "1", "--epochs", "3",
                       *SMALL, "--max-restarts", "1", "--trainer-arg=--fault-kill", "--trainer-arg=1:20")


@pytest.mark.parametrize("runtime", ["native", "auto"])
def test_the_dry_run_plan_is_the_plan_that_runs(runtime: str, request: pytest.FixtureRequest) -> None:
    """No --rdzv-port (and no --gpus for the native run), --runtime auto: what only the hosts can tell is decided
    by the dry run's probe exactly as by the run's (these hosts' users cannot reach a Docker engine: auto is
    native)."""
    made: PlannedRun = request.getfixturevalue(f"{runtime}_run")
    bed: Testbed = request.getfixturevalue("bed")
    planned = made.planned
    assert not made.dry_runs.exists()  # a dry run records nothing
    assert planned["unknown"] == [] and planned["runtime"] == "native" and planned["rdzv_port"] == 29400
    assert planned["nproc_per_node"] == (2 if runtime == "native" else 1)  # CPU-only hosts: two each, unless told
    assert [f["torch"] for f in planned["node_facts"]] == [torch_version()] * 2
    ran, run = made.result, made.run
    executed = json.loads((run / "plan.json").read_text())
    assert comparable_plan(executed) == comparable_plan(planned)
    record = json.loads((run / "run.json").read_text())
    assert record["runtime"] == "native"
    assert [f["label"] for f in record["node_facts"]] == [h.spec for h in bed.hosts[:2]]
    assert json.loads(ran.stdout)["summary"]["world_size"] == 2 * planned["nproc_per_node"]


def test_a_saved_plan_runs_exactly_on_the_hosts(bed: Testbed, tmp_path: Path) -> None:
    """`up --dry-run --save-plan` on two hosts, then `up --plan`: the hosts are probed again and give the same plan,
    and the run's plan.json is the saved file, byte for byte as JSON (hosts' facts included)."""
    saved = tmp_path / "two-hosts.json"
    dry = up(bed, bed.hosts[:2], tmp_path / "runs", "--gpus", "1", "--dry-run", "--save-plan", str(saved))
    assert dry.returncode == 0, dry.stderr
    assert not (tmp_path / "runs").exists()
    ran = ddpctl(bed, "up", "--plan", str(saved), "--runs-dir", str(tmp_path / "runs"), "--json")
    assert ran.returncode == 0, ran.stderr
    assert json.loads((the_run(tmp_path / "runs") / "plan.json").read_text()) == json.loads(saved.read_text())
    assert json.loads(ran.stdout)["summary"]["world_size"] == 2


def test_a_dry_run_verifies_host_keys_and_records_none(bed: Testbed, tmp_path: Path) -> None:
    """An unknown host key is refused as a run would refuse it (the plan is still shown, its unknowns named);
    with --accept-new-host-keys the hosts are probed, and the key is still not written anywhere."""
    known_hosts = tmp_path / "known_hosts"
    args = ["up", *host_args(bed.hosts[:2]), "--runs-dir", str(tmp_path / "runs"), "--dry-run"]
    refused = run_ddpctl(bed, *args, known_hosts=known_hosts)
    assert refused.returncode == 1
    assert "unknown host key" in refused.stderr and "--accept-new-host-keys" in refused.stderr
    assert "not known without probing the hosts" in refused.stdout and "processes per node" in refused.stdout
    accepted = run_ddpctl(bed, *args, "--accept-new-host-keys", "--json", known_hosts=known_hosts)
    assert accepted.returncode == 0, accepted.stderr
    assert json.loads(accepted.stdout)["unknown"] == []
    assert not known_hosts.exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("strategy", ["dp", "mp", "ddp-mp"])
def test_a_strategy_needing_gpus_is_refused_on_cpu_hosts_before_anything_starts(bed: Testbed, tmp_path: Path,
                                                                               strategy: str) -> None:
    """The test bed's hosts have no GPU: the probe finds that out, and the run is refused by host, in the
    preflight's words, with no run directory and nothing started on the hosts."""
    runs = tmp_path / "runs"
    hosts = bed.hosts[:2] if strategy == "ddp-mp" else bed.hosts[:1]  # dp and mp drive one node
    result = up(bed, hosts, runs, "--gpus", "2", "--strategy", strategy)
    assert result.returncode == 1
    assert f"--strategy {strategy} needs" in result.stderr and "the host has 0" in result.stderr
    assert all(h.spec in result.stderr for h in hosts)
    assert not runs.exists() or not any(runs.iterdir())


def torch_version() -> str:
    from importlib import metadata

    return metadata.version("torch").split("+")[0]


def test_two_hosts_train_and_everything_is_pulled_and_verified(bed: Testbed, native_run: PlannedRun) -> None:
    """Two hosts, two processes each, 2 epochs (the run of `native_run`)."""
    run = native_run.run
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 4 and summary["nnodes"] == 2 and summary["epochs"] == 2
    assert [json.loads(x)["epoch"] for x in (run / "timing.jsonl").read_text().splitlines()] == [1, 2]
    workspace = f".ddpctl/runs/{run.name}"
    for k, host in enumerate(bed.hosts[:2]):
        node = run / "nodes" / str(k)
        snapshots = list((node / "out" / "snapshots").iterdir())
        assert snapshots, f"node {k} keeps its own snapshot copy"
        assert any((node / "logs").rglob("*.log"))
        assert (node / "exit_code").read_text().strip() == "0"
        for file in [*snapshots, node / "torchrun.out"]:
            remote = f"{host.home}/{workspace}/{file.relative_to(node)}"
            assert sha256(file) == host_sha256(host, remote)
        assert not (node / "code").exists(), "shipped code is not pulled back"

    again = ddpctl(bed, "pull", str(run))
    assert again.returncode == 0, again.stderr
    assert "pulled 0 bytes" in again.stderr

    # An interrupted or damaged local copy: the next pull restores it, verified against the host.
    snapshot = sorted((run / "nodes" / "1" / "out" / "snapshots").iterdir())[-1]
    snapshot.write_bytes(snapshot.read_bytes()[:100])
    (run / "nodes" / "0" / "torchrun.out").unlink()
    repaired = ddpctl(bed, "pull", str(run))
    assert repaired.returncode == 0, repaired.stderr
    remote = f"{bed.hosts[1].home}/{workspace}/out/snapshots/{snapshot.name}"
    assert sha256(snapshot) == host_sha256(bed.hosts[1], remote)
    assert (run / "nodes" / "0" / "torchrun.out").exists()

    status = ddpctl(bed, "status", str(run), "--json")
    assert [n["state"] for n in json.loads(status.stdout)["nodes"]] == ["finished", "finished"]


@pytest.fixture(scope="module")
def three_host_run(bed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """`up --json` on the three hosts in reverse order, one process each, 1 epoch: read by the three-hosts test and
    by the pull's symlink test. Hosts in reverse: node 0 hosts the rendezvous, but torchrun gives global rank 0 to
    the smallest address, the last node's (bed.hosts[0]); its outputs are the run's all the same."""
    runs = tmp_path_factory.mktemp("three") / "runs"
    result = up(bed, bed.hosts[::-1], runs, "--gpus", "1", "--epochs", "1", "--json")
    assert result.returncode == 0, result.stderr
    return result


def test_three_hosts_with_different_ports_and_users(bed: Testbed,
                                                    three_host_run: subprocess.CompletedProcess[str]) -> None:
    assert len({h.port for h in bed.hosts}) == 3 and len({h.user for h in bed.hosts}) == 3
    summary = json.loads(three_host_run.stdout)["summary"]
    assert summary["world_size"] == 3 and summary["nnodes"] == 3
    run = Path(json.loads(three_host_run.stdout)["run_dir"])
    assert (run / "nodes" / "2" / "out" / "summary.json").exists(), "rank 0 ran on the last node"
    assert not (run / "nodes" / "0" / "out" / "summary.json").exists()
    assert json.loads((run / "summary.json").read_text()) == summary
    assert json.loads((run / "progress.json").read_text())["state"] == "done"


def test_launcher_killed_mid_run_training_finishes_and_status_pull_get_it(bed: Testbed, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    env = {**os.environ, "DDPCTL_KNOWN_HOSTS": str(bed.known_hosts_path)}
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "up", *host_args(bed.hosts[:2]), "--gpus", "1",
                             "--runs-dir", str(runs), "--epochs", "2", *SMALL, "-i", bed.client_key_path],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not list(runs.glob("*/events.jsonl")):
            time.sleep(0.2)
        events = next(runs.glob("*/events.jsonl"))
        while time.monotonic() < deadline and '"started"' not in events.read_text():
            time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)  # the launcher and its SSH connections vanish at once
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    run = the_run(runs)
    status = ddpctl(bed, "status", str(run), "--json")  # the launcher gone, the nodes still training
    assert status.returncode == 0, status.stderr
    deadline = time.monotonic() + 240
    # Each node writes its exit code when its torchrun has ended (hosts share this file system): `status` is asked
    # again once both have, not every two seconds of the training.
    ended = [Path(h.home, ".ddpctl", "runs", run.name, "exit_code") for h in bed.hosts[:2]]
    while time.monotonic() < deadline and not all(p.exists() for p in ended):
        time.sleep(0.5)
    states: list[str] = []
    while time.monotonic() < deadline:
        status = ddpctl(bed, "status", str(run), "--json")
        assert status.returncode == 0, status.stderr
        states = [n["state"] for n in json.loads(status.stdout)["nodes"]]
        if all(s != "running" for s in states):
            break
        time.sleep(2)
    assert states == ["finished", "finished"]
    pulled = ddpctl(bed, "pull", str(run))
    assert pulled.returncode == 0, pulled.stderr
    assert json.loads((run / "summary.json").read_text())["epochs"] == 2


def test_worker_killed_on_node1_recovers_from_snapshots(bed: Testbed, auto_run: PlannedRun) -> None:
    # Global rank 1 is node 1's worker (1 per node); it SIGKILLs itself mid-epoch on the first attempt.
    result = auto_run.result
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)["summary"]
    assert summary["restarts"] == 1 and summary["epochs"] == 3
    run = Path(json.loads(result.stdout)["run_dir"])
    assert [json.loads(x)["epoch"] for x in (run / "timing.jsonl").read_text().splitlines()] == [1, 2, 3]
    # The restart is told (issue 22): which rank on which node ended, and how; live, in events.jsonl, in status.
    told = f"torchrun restarted the workers (attempt 1): rank 1 on node 1 ({bed.hosts[1].spec}) was killed by SIGKILL"
    assert result.stderr.count(told) == 1, result.stderr
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    restarted = sorted((e["node"], e["attempt"], e["cause"]["rank"], e["cause"]["node"], e["cause"]["signal"])
                       for e in events if e["event"] == "restarted")
    assert restarted == [(0, 1, 1, 1, "SIGKILL"), (1, 1, 1, 1, "SIGKILL")]  # both nodes' workers restarted
    status = ddpctl(bed, "status", str(run), "--json")
    shown = json.loads(status.stdout)
    assert [n["restarts"] for n in shown["nodes"]] == [1, 1], status.stdout  # node 0 restarted too
    assert [r["cause"]["summary"] for r in shown["restarts"]] == [told.split(": ", 1)[1]]
    said = ddpctl(bed, "status", str(run))
    assert f"restart 1: rank 1 on node 1 ({bed.hosts[1].spec}) was killed by SIGKILL" in said.stdout + said.stderr
    # No attempt overwrote another: attempt 0's rank logs are still there on every node's host, and came back.
    nodes = json.loads((run / "run.json").read_text())["nodes"]
    for k, host in enumerate(bed.hosts[:2]):
        listed = host.run_as_user(["sh", "-c", f'cd && ls {nodes[k]["workspace"]}/logs/*/attempt_*/0/stdout.log'])
        out = listed.stdout.decode() if isinstance(listed.stdout, bytes) else listed.stdout
        assert [line.split("/logs/", 1)[1].split("/", 1)[1] for line in out.split()] == [
            "attempt_0/0/stdout.log", "attempt_1/0/stdout.log"], out
        for attempt in (0, 1):  # and came back
            assert len(list((run / "nodes" / str(k) / "logs").glob(f"*/attempt_{attempt}/0/stdout.log"))) == 1
    missing = ddpctl(bed, "logs", str(run), "--rank", "0", "--attempt", "5")  # an attempt that never ran
    assert missing.returncode == 1 and "its attempts are 0 to 1" in missing.stderr, missing.stderr


def test_a_hung_rank_is_stopped_by_stall_timeout_and_what_was_written_is_pulled(bed: Testbed, tmp_path: Path) -> None:
    # Rank 1 stops responding mid-epoch; rank 0 then waits in its collective (gloo would wait 30 minutes).
    result = up(bed, bed.hosts[:2], tmp_path / "runs", "--gpus", "1", "--stall-timeout", "15",
                "--trainer-arg=--fault-hang", "--trainer-arg=1:20")  # in epoch 2 of 16 steps each
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: --stall-timeout: no training step for 15 s") and "pulled to" in last, result.stderr
    run = the_run(tmp_path / "runs")
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert "stop_requested" in kinds and kinds.index("stop_requested") < kinds.index("pulled")
    for k in (0, 1):  # epoch 1's snapshots came back; the run never finished
        assert [p.name for p in (run / "nodes" / str(k) / "out" / "snapshots").glob("*.pt")] == [
            "snapshot-epoch-000001.pt"]
    assert not (run / "summary.json").exists()
    for host in bed.hosts[:2]:
        left = host.run_as_user(["pgrep", "-u", host.user, "-f", "trainer"], check=False)
        assert left.returncode == 1, f"{host.name} still runs: {left.stdout!r}"
    status = ddpctl(bed, "status", str(run), "--json")
    assert all(n["state"] != "running" for n in json.loads(status.stdout)["nodes"])


def test_user_command_arguments_reach_torchrun_intact(bed: Testbed, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    marker = "/tmp/ddpctl-injected"
    (project / "show args.py").write_text(
        "import json, os, sys\n"
        "rank = os.environ['RANK']\n"
        "json.dump([sys.argv[1:], os.environ['EVIL']], open(f'../out/args-{rank}.json', 'w'))\n"
    )
    hostile = ["a b", "it's", '"quoted"', "x; touch " + marker, "$(touch " + marker + ")", "`touch " + marker + "`"]
    env_value = "v; $(touch " + marker + ") `id`"
    result = ddpctl(bed, "up", *host_args(bed.hosts[:2]), "--gpus", "1", "--runs-dir", str(tmp_path / "runs"),
                    "--env", f"EVIL={env_value}", "--", "python3", "show args.py", *hostile, cwd=project)
    assert result.returncode == 0, result.stderr
    run = the_run(tmp_path / "runs")
    for rank, node in ((0, 0), (1, 1)):
        args, evil = json.loads((run / "nodes" / str(node) / "out" / f"args-{rank}.json").read_text())
        assert args == hostile and evil == env_value
    assert not os.path.exists(marker)


def test_a_failing_nodes_log_is_shown_literally_and_the_others_are_stopped(bed: Testbed, tmp_path: Path) -> None:
    """A node's log is the host's text, not markup: '[rank0]' and '[/data/a]' print as they are, escape
    sequences are dropped, and the other node is stopped and everything is pulled."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "fail.py").write_text(
        "import os, sys, time\n"
        "if os.environ['RANK'] == '1':\n"
        "    print('[rank1]: reading [/data/a] failed \\x1b[31mred\\x1b[0m', flush=True)\n"
        "    sys.exit(3)\n"
        "time.sleep(600)\n"
    )
    result = ddpctl(bed, "up", *host_args(bed.hosts[:2]), "--gpus", "1", "--runs-dir", str(tmp_path / "runs"),
                    "--", "python3", "fail.py", cwd=project, timeout=240)
    assert result.returncode != 0
    assert "[rank1]: reading [/data/a] failed red" in result.stderr, result.stderr
    assert "\x1b" not in result.stderr and "Traceback" not in result.stderr
    run = the_run(tmp_path / "runs")
    events = [json.loads(line)["event"] for line in (run / "events.jsonl").read_text().splitlines()]
    assert "node_failed" in events and "stopped" in events and events.count("pulled") == 2
    status = ddpctl(bed, "status", str(run), "--json")
    assert all(n["state"] != "running" for n in json.loads(status.stdout)["nodes"])


def test_link_down_before_start_is_named_by_preflight(bed: Testbed, tmp_path: Path) -> None:
    bed.hosts[1].link_down()
    try:
        result = ddpctl(bed, "up", *host_args(bed.hosts[:2]), "--runs-dir", str(tmp_path), "--connect-timeout", "3",
                        timeout=120)
    finally:
        bed.hosts[1].link_up()
    assert result.returncode == 1
    assert bed.hosts[1].spec in result.stderr and "unreachable" in result.stderr
    assert bed.hosts[0].spec not in result.stderr.split("\n", 1)[1]
    assert not any(tmp_path.iterdir()), "no run directory for a run that never started"


def test_host_keys_unknown_refused_then_accepted_changed_always_refused(bed: Testbed, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    host = bed.hosts[2]
    refused = ddpctl(bed, "doctor", "--host", host.spec, known_hosts=known)
    assert refused.returncode == 1
    assert host.host_key_fingerprint in refused.stderr and "--accept-new-host-keys" in refused.stderr
    accepted = ddpctl(bed, "doctor", "--host", host.spec, "--accept-new-host-keys", "--json", known_hosts=known)
    assert accepted.returncode == 0, accepted.stderr
    assert json.loads(accepted.stdout)["ok"] is True
    assert host.known_hosts_line().split()[1:] == known.read_text().split()[1:3]
    host.regenerate_host_key()
    changed = ddpctl(bed, "doctor", "--host", host.spec, "--accept-new-host-keys", known_hosts=known)
    assert changed.returncode == 1 and "changed" in changed.stderr.lower()
    bed.write_known_hosts()


def test_python_option_serves_every_step_on_a_host_without_python3(bed: Testbed, tmp_path: Path) -> None:
    """--python names the hosts' interpreter for all that runs there (preflight, shipping, torchrun, pull)."""
    host = bed.hosts[1]
    saved = host.ssh_environment()
    real_python = saved["PATH"].split(":")[0] + "/python3"
    write_user_file(Path(host.home, "nopython", "python3"), "#!/bin/sh\necho 'no python3 here' >&2\nexit 127\n",
                    host.user, 0o755)
    host.update_ssh_environment({"PATH": f"{host.home}/nopython:{saved['PATH']}"})
    runs = tmp_path / "runs"
    try:
        without = up(bed, [host], runs, "--gpus", "1", "--epochs", "1")
        assert without.returncode == 1 and "--python" in without.stderr
        result = up(bed, [host], runs, "--gpus", "1", "--epochs", "1", "--python", real_python)
    finally:
        host.set_ssh_environment(saved)
    assert result.returncode == 0, result.stderr
    run = the_run(runs)
    assert json.loads((run / "summary.json").read_text())["epochs"] == 1
    assert (run / "nodes" / "0" / "torchrun.out").is_file()


def test_doctor_marks_the_host_that_cannot_run_not_ready(bed: Testbed) -> None:
    """Host labels hold ':' (user@addr:port): the problem must land on that host's row, not float free."""
    short, fine = bed.hosts[0], bed.hosts[1]
    result = ddpctl(bed, "doctor", "--host", short.spec, "--host", fine.spec, "--gpus", "64", "--json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    rows = {row["host"]: row for row in report["hosts"]}
    assert report["ok"] is False and report["problems"] == []
    assert rows[short.spec]["ok"] is False
    assert any("--gpus 64 but the host has" in p for p in rows[short.spec]["problems"])
    table = ddpctl(bed, "doctor", "--host", short.spec, "--gpus", "64")
    assert table.returncode == 1
    assert f"{short.spec}: --gpus 64 but the host has" in table.stderr
    first_row = next(line for line in table.stdout.splitlines() if line.startswith("│"))  # the table: stdout
    assert first_row.split("│")[-2].strip() == "no", table.stdout
    assert fine.spec in rows


def test_malicious_host_symlink_is_not_followed_by_pull(bed: Testbed,
                                                       three_host_run: subprocess.CompletedProcess[str]) -> None:
    """A link to /etc/shadow in the output folder of node 2 (bed.hosts[0], where rank 0 wrote the run's summary)."""
    run = Path(json.loads(three_host_run.stdout)["run_dir"])
    host = bed.hosts[0]
    host.run_as_user(["ln", "-s", "/etc/shadow", f"{host.home}/.ddpctl/runs/{run.name}/out/stolen"])
    pulled = ddpctl(bed, "pull", str(run))
    assert pulled.returncode == 0, pulled.stderr
    assert "symbolic links are not pulled" in pulled.stderr and "out/stolen" in pulled.stderr
    assert not list(run.rglob("stolen"))
    assert (run / "nodes" / "2" / "out" / "summary.json").is_file()
