"""pytest fixtures for tests on the real multi-host test bed (network namespaces + sshd; needs root).

Other test modules use them through tests/conftest.py (`testbed`), and `connect()` to reach a host:

    @needs_testbed
    def test_x(testbed):
        with connect(testbed, testbed.hosts[0]) as conn:
            assert conn.run(["true"]).ok
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.testbed import SSHD, Testbed, TestHost, cleanup_stale
from launcher.spec.hosts import parse_host
from launcher.transport.known_hosts import KnownHosts
from launcher.transport.ssh import Connection, resolve_target
from tests.cli_runner import ddpctl_on_bed

TESTBED_PREFIX = "ddptb"
REPO = Path(__file__).resolve().parent.parent

_missing = [tool for tool in ("ip", "iptables", "nsenter", "setpriv", "useradd", "ssh-keygen")
            if shutil.which(tool) is None]
TESTBED_UNAVAILABLE = os.geteuid() != 0 or not os.path.exists(SSHD) or bool(_missing)
TESTBED_SKIP_REASON = (f"the test bed needs root, {SSHD} and {', '.join(_missing) or 'iproute2/iptables'} "
                       "(infra/setup.sh --test installs them)")
needs_testbed = pytest.mark.skipif(TESTBED_UNAVAILABLE, reason=TESTBED_SKIP_REASON)


def bed_known_hosts(bed: Testbed) -> KnownHosts:
    """Trust exactly the bed's hosts (their keys in the bed's file); the user's ~/.ssh/known_hosts is not read."""
    return KnownHosts(ddpctl_file=bed.known_hosts_path, system_file=Path("/nonexistent/known_hosts"))


def connect(bed: Testbed, host: TestHost, *, known_hosts: KnownHosts | None = None, **kwargs: Any) -> Connection:
    """A Connection to `host` as its login user with the bed's client key (no agent, no ~/.ssh/config)."""
    target = resolve_target(parse_host(host.spec), ssh_config=Path("/nonexistent/ssh_config"),
                            identity_file=Path(bed.client_key_path))
    kwargs.setdefault("connect_timeout", 10)
    return Connection(target, known_hosts=known_hosts or bed_known_hosts(bed), allow_agent=False, **kwargs)


# `ddpctl COMMAND -i BED_KEY ...` trusting the bed's keys: tests/cli_runner.py's, by the name the bed's tests use.
run_ddpctl = ddpctl_on_bed


def _start_bed(n_hosts: int, ports: list[int]) -> Testbed:
    cleanup_stale(TESTBED_PREFIX)  # beds left by killed test runs (their owner process is gone)
    return Testbed(TESTBED_PREFIX, n_hosts=n_hosts, ports=ports)


@pytest.fixture(scope="module")
def testbed() -> Iterator[Testbed]:
    """Two hosts (ports 22 and 2222), shared by the tests of one module; removed at the module's end."""
    if TESTBED_UNAVAILABLE:
        pytest.skip(TESTBED_SKIP_REASON)
    bed = _start_bed(2, [22, 2222])
    try:
        yield bed
    finally:
        bed.stop()


SHARED_PREFIX = "ddp2h"


@pytest.fixture(scope="session")
def two_hosts() -> Iterator[Testbed]:
    """Two hosts (ports 22 and 2222, each its own login user) with this machine's python and torch, made once per
    pytest process for every module that runs on two such hosts; a module borrows them through `lent`."""
    if TESTBED_UNAVAILABLE:
        pytest.skip(TESTBED_SKIP_REASON)
    cleanup_stale(SHARED_PREFIX)
    bed = Testbed(SHARED_PREFIX, n_hosts=2, ports=[22, 2222], host_python=True)
    try:
        yield bed
    finally:
        bed.stop()


def lent(bed: Testbed) -> Iterator[Testbed]:
    """A module's fixture over `two_hosts` (`yield from lent(two_hosts)`): the bed, then, whatever the module did
    to it (links cut, sshd stopped, processes left, files written), each host back as the bed made it."""
    try:
        yield bed
    finally:
        bed.reset()


def comparable_plan(plan: dict[str, Any]) -> dict[str, Any]:
    """A plan (`up --dry-run --json`, or a run's plan.json) with what differs between two runs of the same
    options taken out: the run id (in workspaces, container names and commands) and the facts that change on
    their own (free disk)."""
    text = json.dumps(plan).replace(plan["run_id"], "RUN_ID")
    same = json.loads(text)
    for facts in same.get("node_facts", []):
        facts.pop("disk_free", None)
    return same
