"""`ddpctl up --env NAME=VALUE` (API keys, tokens): the value reaches the node's processes and nothing else sees
it — not the host's process table, not run.json, events.jsonl or --dry-run. On the real SSH test bed (its hosts
share this machine's process table) and on the real local Docker engine."""

from __future__ import annotations

import base64
import json
import os
import secrets
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from infra.testbed import Testbed
from launcher.planning.plan import NodeHost, plan_remote
from launcher.runtimes.docker import container_name, docker_node_plan
from launcher.runtimes.native import encode_env, start_program
from launcher.runtimes.start import env_file, node_files, start_argv
from launcher.spec.run_spec import RunSpec
from tests import cli_runner
from tests.docker_fixtures import REPO, base_image, requires_docker, test_image  # noqa: F401
from tests.testbed_fixtures import TESTBED_SKIP_REASON, TESTBED_UNAVAILABLE, connect, lent, run_ddpctl

NAME = "DDPCTL_TEST_TOKEN"
# The user's script: prints the variable into the run's output (each rank's stdout log), then, given a path,
# waits for that file to appear, so the test can look at the process table while it runs.
SHOW_ENV = """\
import json, os, sys, time
print("SHOWN " + json.dumps(os.environ["DDPCTL_TEST_TOKEN"]), flush=True)
deadline = time.time() + 120
while len(sys.argv) > 1 and not os.path.exists(sys.argv[1]) and time.time() < deadline:
    time.sleep(0.2)
"""
needs_testbed = pytest.mark.skipif(TESTBED_UNAVAILABLE, reason=TESTBED_SKIP_REASON)
# `python -m launcher` from another directory must still run this checkout's launcher.
LAUNCHER_ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def ddpctl(cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return cli_runner.ddpctl(*args, cwd=cwd, timeout=timeout)


def secret(line_breaks: bool = True) -> tuple[str, str]:
    """A unique token, and a value holding it with what shells and parsers trip over."""
    token = f"tok{secrets.token_hex(8)}"
    value = f" {token} 'sq' \"dq\" $HOME $(id) `id` \\n \\ %s # x=y "
    return token, value + ("\nline two\n" if line_breaks else "")


def shown(logs: Path) -> list[str]:
    """The values the script printed, from the stdout logs under `logs`."""
    return [json.loads(line[len("SHOWN "):]) for log in logs.rglob("stdout.log")
            for line in log.read_text().splitlines() if line.startswith("SHOWN ")]


class ProcessTable:
    """Samples `ps -eo args` of this machine in the background and keeps every line that holds `token`, but
    those of process `skip` (the ddpctl command the test itself typed: its own argv holds the value)."""

    def __init__(self, token: str, skip: int = -1) -> None:
        self.token, self.skip_pid, self.samples = token, skip, 0
        self.leaks: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            out = subprocess.run(["ps", "-ww", "-eo", "pid=,args="], capture_output=True, text=True).stdout
            self.samples += 1
            self.leaks += [line for line in out.splitlines()
                           if self.token in line and line.split(None, 1)[0] != str(self.skip_pid)]
            self._stop.wait(0.2)

    def __enter__(self) -> ProcessTable:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def wait_for(predicate: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


# ---- no host needed ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", [["--gpus", "1"], ["--host", "alice@203.0.113.9"],
                                   ["--host", "alice@203.0.113.9", "--runtime", "docker"]])
def test_dry_run_shows_the_names_only(where: list[str], tmp_path: Path) -> None:
    token, value = secret(line_breaks=False)
    no_probe = ["--no-probe"] if "--host" in where else []  # documentation addresses: never contacted
    result = ddpctl(tmp_path, "up", "--dry-run", *no_probe, *where, "--env", f"{NAME}={value}")
    assert result.returncode == 0, result.stderr
    assert f"{NAME}=***" in result.stdout
    assert token not in result.stdout + result.stderr


def test_docker_refuses_a_value_with_a_line_break_in_one_line(tmp_path: Path) -> None:
    result = ddpctl(tmp_path, "up", "--dry-run", "--no-probe", "--host", "alice@203.0.113.9", "--runtime", "docker",
                    "--env",
                    f"{NAME}=a\nb")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [f"error: --env {NAME}: a value with a line break cannot reach a container "
                                          "(docker's --env-file holds one line per variable); use --runtime native "
                                          "for it"]


def test_a_local_run_gets_the_value_and_run_json_keeps_the_name_only(tmp_path: Path) -> None:
    token, value = secret()
    (tmp_path / "show_env.py").write_text(SHOW_ENV)
    runs = tmp_path / "runs"
    result = ddpctl(tmp_path, "up", "--gpus", "1", "--runs-dir", str(runs), "--env", f"{NAME}={value}", "--", "python3",
                    "show_env.py")
    assert result.returncode == 0, result.stderr
    (run,) = runs.iterdir()
    assert shown(run / "logs") == [value]
    assert json.loads((run / "run.json").read_text())["spec"]["extra_env"] == {NAME: "***"}
    for name in ("run.json", "events.jsonl"):
        assert token not in (run / name).read_text(), name


def test_env_given_by_name_takes_the_value_from_the_shell_and_no_command_line_holds_it(tmp_path: Path) -> None:
    """`--env NAME`, as `docker run -e NAME`: the value comes from ddpctl's own environment, so not even the
    command the user typed shows it in the process table."""
    token, value = secret()
    (tmp_path / "show_env.py").write_text(SHOW_ENV)
    runs = tmp_path / "runs"
    with ProcessTable(token) as table:
        result = cli_runner.ddpctl("up", "--gpus", "1", "--runs-dir", str(runs), "--env", NAME, "--", "python3",
                                   "show_env.py", cwd=tmp_path, env={NAME: value}, timeout=300)
    assert result.returncode == 0, result.stderr
    (run,) = runs.iterdir()
    assert shown(run / "logs") == [value]
    assert table.samples >= 2 and table.leaks == []
    assert json.loads((run / "run.json").read_text())["spec"]["extra_env"] == {NAME: "***"}
    assert token not in (run / "run.json").read_text() + (run / "events.jsonl").read_text()


def test_env_given_by_name_that_the_shell_lacks_is_one_line(tmp_path: Path) -> None:
    environ = {key: value for key, value in cli_runner.ddpctl_env().items() if key != NAME}
    result = subprocess.run(cli_runner.ddpctl_argv("up", "--dry-run", "--gpus", "1", "--env", NAME), cwd=tmp_path,
                            capture_output=True, text=True, env=environ, timeout=120)
    assert result.returncode == 1 and not list(tmp_path.iterdir())
    assert result.stderr.splitlines() == [f"error: --env {NAME}: {NAME} is not set in this shell: export it first, "
                                          f"or give {NAME}=VALUE"]


# ---- on SSH hosts ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bed(two_hosts: Testbed) -> Iterator[Testbed]:
    """The shared two hosts, of which the first is used."""
    yield from lent(two_hosts)


@needs_testbed
def test_the_value_reaches_the_host_in_a_0600_file(bed: Testbed) -> None:
    host = bed.hosts[0]
    _, value = secret()
    node = plan_remote(RunSpec(run_id="envfile", nnodes=1, extra_env=((NAME, value),)),
                       [NodeHost(host.spec, host.address)]).nodes[0]
    host.run_as_user(["mkdir", "-p", node.workspace])
    with connect(bed, host) as conn:  # the start program as start_node runs it, with no environment file to read
        started = conn.run(["python3", "-c", start_program(), node.workspace, node.workspace, "", "2", "stdin", "true"],
                           timeout=30, stdin=node_files(node))
    assert started.exit_code == 0 and started.stdout.strip().isdigit(), started
    name, data = env_file(node)
    path = f"{host.home}/{node.workspace}/{name}"
    assert host.run_as_user(["stat", "-c", "%a %U", path]).stdout.decode().split() == ["600", host.user]
    assert host.run_as_user(["stat", "-c", "%a", f"{host.home}/{node.workspace}"]).stdout.decode().strip() == "700"
    assert Path(path).read_bytes() == data == encode_env(node.env)


@needs_testbed
def test_the_value_reaches_the_node_and_not_the_process_table_or_the_run_directory(bed: Testbed,
                                                                                    tmp_path: Path) -> None:
    host = bed.hosts[0]
    token, value = secret()
    (tmp_path / "show_env.py").write_text(SHOW_ENV)
    release = f"{host.home}/release-{token[3:]}"
    runs = tmp_path / "runs"
    env = {**LAUNCHER_ENV, "DDPCTL_KNOWN_HOSTS": str(bed.known_hosts_path)}
    launcher = subprocess.Popen([sys.executable, "-m", "launcher", "up", "-i", bed.client_key_path, "--host",
                                 host.spec, "--gpus", "1", "--name", "envsecret", "--runs-dir", str(runs), "--env",
                                 f"{NAME}={value}", "--", "python3", "show_env.py", release], cwd=tmp_path, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with ProcessTable(token, skip=launcher.pid) as table:
            workspaces = Path(host.home, ".ddpctl", "runs")
            wait_for(lambda: any(shown(workspaces)) or launcher.poll() is not None, 120, "the script did not start")
            before = table.samples
            wait_for(lambda: table.samples >= before + 5, 30, "ps was not sampled")
            (workspace,) = workspaces.glob("envsecret-*")
            assert not (workspace / "env").exists(), "the environment file is deleted once the node read it"
            host.run_as_user(["touch", release])
            _, stderr = launcher.communicate(timeout=240)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 0, stderr
    assert table.leaks == [], "the value showed in the process table"
    (run,) = runs.iterdir()
    assert shown(run / "nodes" / "0" / "logs") == [value]
    record = json.loads((run / "run.json").read_text())
    assert record["spec"]["extra_env"] == {NAME: "***"}
    planned = [json.loads(e) for e in (run / "events.jsonl").read_text().splitlines() if '"planned"' in e]
    assert f"{NAME}=***" in planned[0]["nodes"][0]
    for name in ("run.json", "events.jsonl"):
        assert token not in (run / name).read_text(), name
    # Reattaching reads the masked spec back: it needs no values.
    pulled = run_ddpctl(bed, "pull", str(run))
    assert pulled.returncode == 0, pulled.stderr


# ---- in a container on the local engine -----------------------------------------------------------------------


@requires_docker
@pytest.mark.docker
def test_a_container_gets_the_value_and_the_process_table_does_not(test_image: str, tmp_path: Path) -> None:  # noqa: F811
    """The docker node as a host runs it (start command, wrapper, `docker run --env-file`), here."""
    token, value = secret(line_breaks=False)
    spec = RunSpec(run_id=f"env-{secrets.token_hex(3)}", nnodes=1, nproc_per_node=1, extra_env=((NAME, value),),
                   user_command=("python3", "show_env.py", "/workspace/release"))
    node = docker_node_plan(spec, 0, NodeHost("a", "127.0.0.1"), "127.0.0.1", "ws", test_image)
    ws = tmp_path / "ws"
    (ws / "code").mkdir(parents=True)
    (ws / "code" / "show_env.py").write_text(SHOW_ENV)
    for name, data, mode in json.loads(node_files(node)):  # what start_node writes first (env file, wrapper, hook)
        path = ws / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        path.chmod(mode)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    try:
        with ProcessTable(token) as table:
            subprocess.run(["sh", "-c", shlex.join(start_argv(node))], cwd=tmp_path, env=env, check=True,
                           capture_output=True, timeout=30)
            wait_for(lambda: any(shown(ws / "logs")) or (ws / "exit_code").exists(), 120,
                     "the script did not start")
            before = table.samples
            wait_for(lambda: table.samples >= before + 5, 30, "ps was not sampled")
            assert not (ws / env_file(node)[0]).exists(), "the env file is deleted once the container exists"
            (ws / "release").touch()
            wait_for(lambda: (ws / "exit_code").exists(), 120, "the node did not finish")
        assert (ws / "exit_code").read_text().strip() == "0", (ws / "torchrun.out").read_text()[-2000:]
        assert table.leaks == [], "the value showed in the process table"
        assert shown(ws / "logs") == [value]
    finally:
        subprocess.run(["docker", "rm", "-f", container_name(spec.run_id, 0)], capture_output=True)
