"""`up --provider vast --interruptible`: VastProvider renting bid machines, and after a loss, a new set of them into
the same run (its run directory, ledger and known_hosts): the lost attempt's machines are destroyed, a new set is
rented with the same filters (for several nodes: one cluster, a new overlay, as provisioning always does), and the
files the run resumes from are put on them (launcher/places/vast/resume_files.py). The sequence that uses it is
launcher/places/vast/interruptible_chain.py."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.errors import SpecError
from launcher.places.vast.budget import check_fits
from launcher.places.vast.interruptible import bid_for, bid_line, biddable, lost_nodes
from launcher.places.vast.ledger import live, say
from launcher.places.vast.market import first_machines
from launcher.places.vast.provider import VastProvider, _provision, _reach, _report_rented
from launcher.places.vast.registry_login import registry_login
from launcher.places.vast.sshkey import ensure_vast_ssh_key
from launcher.places.vast.teardown import teardown
from launcher.transport.hostsession import HostSession
from launcher.transport.known_hosts import host_key_name
from launcher.transport.ssh import SSHTarget

if TYPE_CHECKING:
    from launcher.places.vast.models import Offer
    from launcher.planning.request import UpOptions
    from launcher.providers.base import AcquiredHosts, ExecutorCalls
    from launcher.spec.run_spec import RunSpec


def at_bid(offer: Offer, bid: float) -> Offer:
    """The offer priced at `bid` instead of its min_bid (what a bid search's dph_total holds)."""
    return replace(offer, dph_total=offer.dph_total - (offer.min_bid or 0.0) + bid)


def forget_host_keys(path: Path, names: set[str]) -> None:
    """Drop the lines of a run's known_hosts file that name one of `names` (rewritten whole, mode 0600)."""
    if not names or not path.is_file():
        return
    kept = [line for line in path.read_text().splitlines(keepends=True) if line.split(" ", 1)[0] not in names]
    temp = path.with_name(f".{path.name}.new")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write("".join(kept))
    os.replace(temp, path)


class InterruptibleVastProvider(VastProvider):
    """Rents interruptible machines (a `price` bid on each offer); can say which of them were lost and rent a new
    set into the same run."""

    def __init__(self, options: UpOptions, calls: ExecutorCalls) -> None:
        super().__init__(options, calls)
        if options.detach:
            raise SpecError("--interruptible needs `up` to follow the run (it replaces outbid machines and resumes): "
                            "drop --detach")
        self.bid_for = lambda offer: bid_for(offer, self.req.bid)
        self.label = ""  # the current set's label (the run id, then RUN-r1, RUN-r2, ... for replacements)

    def _offers(self, spec: RunSpec) -> tuple[RunSpec, list[Offer]]:
        """The bid offers, priced at what is bid on each (the search priced them at min_bid): the dry run and
        --max-cost's worst case then count the bid; the bid is told before anything is rented."""
        spec, offers = super()._offers(spec)
        offers = [at_bid(o, bid_for(o, self.req.bid)) for o in biddable(offers, self.req.bid)]
        picked = first_machines(offers, self.req.nodes)
        say(bid_line(picked, self.req.bid))
        check_fits(picked, self.req)
        return spec, offers

    def acquire(self, spec: RunSpec, options: UpOptions) -> AcquiredHosts:
        self.label = spec.run_id
        return super().acquire(spec, options)

    def current(self) -> dict[int, int]:
        """node -> instance id of the set the run trains on now."""
        assert self._ledger is not None
        return {int(i["node"]): int(i["instance_id"]) for i in self._ledger.instances
                if i.get("state") == "rented" and i.get("node") is not None}

    def lost(self) -> dict[int, dict[str, Any]]:
        """The current set's machines that can no longer train (node -> what the API showed)."""
        assert self._client is not None
        return lost_nodes(self._client, self.label, self.current())

    def destroy_current(self, reason: str) -> None:
        """Destroy every machine still billing (the lost set: survivors and the lost) and its overlay, verified;
        the run stays open (its next set is rented next)."""
        assert self._client is not None and self._ledger is not None
        ledger = self._ledger
        gone = live(ledger.instances)
        overlay = next((i.get("overlay_name") for i in gone if i.get("overlay_name")), None)
        ledger.run_dir.event("vast.teardown", reason=reason, instances=[i["instance_id"] for i in gone])
        results = teardown(self._client, [int(i["instance_id"]) for i in gone], overlay_name=overlay)
        ledger.record_teardown(results, reason)
        for inst in gone:  # the overlay went with them: the run's final teardown deletes only the current one
            if inst.get("overlay_name"):
                inst["overlay_deleted"] = inst.pop("overlay_name")
        ledger.save()
        # A destroyed machine's address and port may be rented again into the next set (a survivor's machine is
        # free again), by a new container with a new host key: its old key must not refuse it.
        forget_host_keys(ledger.run_dir.path / "known_hosts",
                         {host_key_name(str(i["ssh_host"]), int(i["ssh_port"])) for i in gone
                          if i.get("ssh_host") and i.get("ssh_port") and i.get("state") == "destroyed"})
        failed = [r.instance_id for r in results if not r.destroyed]
        if failed:
            from launcher.errors import DdpctlError

            raise DdpctlError(f"could not verify that the lost set's Vast.ai instance(s) {failed} are destroyed; "
                              f"they may still be billing: `ddpctl down {ledger.run_dir.run_id}` retries")

    def rent_again(self, spec: RunSpec, options: UpOptions, attempt: int) -> AcquiredHosts:
        """A new set of machines for the same run (fresh offers, the same filters and bid rule), reached and with
        their overlay addresses: the hosts the run resumes on."""
        assert self._client is not None and self._ledger is not None
        ledger, req = self._ledger, self.req
        spec, offers = self._offers(spec)
        login = registry_login(str(options.image)) if req.registry_login else None
        key_path, public_key = ensure_vast_ssh_key()
        self.label = f"{spec.run_id}-r{attempt}"
        rented = _provision(self._client, offers, spec, options, req, ledger, public_key, login,
                            self.calls.stop_cause, label=self.label, bid_for=self.bid_for)
        for inst in ledger.instances:
            if inst["instance_id"] in {r.instance_id for r in rented}:
                inst["label"] = self.label
        ledger.run_dir.update_record(released_at=None)  # rented again: the run holds machines once more
        _report_rented(ledger, rented)
        if self._session is not None:
            self._session.close()
        targets = [SSHTarget(label=f"vast:{r.instance_id}", hostname=r.ssh_host, port=r.ssh_port,
                             user=r.ssh_user, identity_files=(str(key_path),)) for r in rented]
        self._session = HostSession(targets, replace(options, accept_new_host_keys=True),
                                    settings={"known_hosts_file": str(ledger.run_dir.path / "known_hosts")})
        try:
            return _reach(spec, options, req, self._session, rented, ledger)
        except BaseException as exc:
            self.release_after_failure(exc)
            raise
