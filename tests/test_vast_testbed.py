"""Provisioning through the stand-in whose instances are real test-bed SSH hosts (netns + sshd)."""

from __future__ import annotations

import ipaddress
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.testbed import Testbed, cleanup_stale
from infra.vast_standin import VastStandIn, make_offer
from launcher.places.vast.client import VastClient
from launcher.places.vast.models import RentedInstance
from launcher.places.vast.offers import OfferFilter, choose_offers, search_offers
from launcher.places.vast.provision import provision, teardown
from launcher.spec.hosts import parse_host
from launcher.transport.ssh import Connection, resolve_target
from tests.testbed_fixtures import TESTBED_PREFIX, bed_known_hosts, needs_testbed

pytestmark = [needs_testbed, pytest.mark.testbed]
KEY = "sk-bed-1234abcd5678"


@pytest.fixture
def bed() -> Iterator[Testbed]:
    cleanup_stale(TESTBED_PREFIX)
    with Testbed(TESTBED_PREFIX, n_hosts=0) as bed:
        yield bed


@pytest.fixture
def our_key(tmp_path: Path) -> Path:
    """The key ddpctl would register: not the bed's key, so a login proves the API installed it."""
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key


def _connect(bed: Testbed, inst: RentedInstance, key: Path) -> Connection:
    target = resolve_target(parse_host(f"{inst.ssh_user}@{inst.ssh_host}:{inst.ssh_port}"),
                            ssh_config=Path("/nonexistent/ssh_config"), identity_file=key)
    return Connection(target, known_hosts=bed_known_hosts(bed), allow_agent=False, connect_timeout=10)


def test_two_real_hosts_rented_reached_over_ssh_and_torn_down(bed, our_key):
    offers = [make_offer(1, 301, dph_base=0.10, cluster_id=3), make_offer(2, 302, dph_base=0.20, cluster_id=3),
              make_offer(3, 303, dph_base=0.30, cluster_id=3)]
    with VastStandIn(api_key=KEY, offers=offers, host_factory=lambda _iid: bed.add_host(22),
                     host_remover=bed.remove_host, boot_delay_s=0.2) as standin:
        standin.faults.stuck_machines.add(301)  # the cheapest never boots: destroyed, its host removed
        client = VastClient(KEY, base_url=standin.url, backoff_base=0.01)
        chosen = choose_offers(search_offers(client, OfferFilter(disk_gb=16)), 2, 16)
        rented = provision(client, chosen, nodes=2, image="ddpctl/trainer:test", disk=16, label="run-bed",
                           ssh_public_key=our_key.with_suffix(".pub").read_text().strip(),
                           ready_timeout=3.0, poll_interval=0.1)
        try:
            assert [r.offer.machine_id for r in rented] == [303, 302]  # node 0 got 301, then 303
            assert len(bed.hosts) == 2  # the stuck instance's host is gone already
            subnet = ipaddress.ip_network(rented[0].overlay_subnet)
            for me, other in ((rented[0], rented[1]), (rented[1], rented[0])):
                with _connect(bed, me, our_key) as conn:
                    # what the lead does to find the overlay address: the interface inside the overlay subnet
                    addrs = conn.check(["ip", "-4", "-o", "addr", "show"], "list addresses").stdout
                    mine = [a.split()[3].split("/")[0] for a in addrs.splitlines() if "inet " in a]
                    assert [a for a in mine if ipaddress.ip_address(a) in subnet] == [me.ssh_host]
                    reach = conn.run(["timeout", "3", "bash", "-c", f"exec 3<>/dev/tcp/{other.ssh_host}/22"])
                    assert reach.ok, reach
        finally:
            results = teardown(client, [r.instance_id for r in rented], overlay_name=rented[0].overlay_name,
                               poll_interval=0.05)
        assert all(r.destroyed for r in results)
        assert standin.live_instances() == [] and bed.hosts == []
        assert standin.validation_failures() == []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"{TESTBED_PREFIX}{bed.idx}h" not in netns
