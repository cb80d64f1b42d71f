"""Shipping a run's plan to its hosts: the image a docker run streams (or has pulled), and the code the plan ships,
to each host's code cache, incrementally; the code's copy into the run's workspace is then the start's
(launcher/runtimes/start.py), unless something is written into the workspace before the start."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from launcher.errors import DdpctlError
from launcher.execute.ship.contents import check_unchanged
from launcher.planning.plan import RunPlan
from launcher.results.progress import console
from launcher.results.rundir import RunDir
from launcher.runtimes.docker_hosts import ensure_image, local_image_id, registry_digest
from launcher.transport import outputs
from launcher.transport.hostsession import HostSession
from launcher.transport.parallel import raise_for_errors, run_on_hosts
from launcher.transport.sync import Listing, read_listing, ship_tree

CODE_CACHE = ".ddpctl/code"
SHIP_ATTEMPTS = 3


def ship_image(session: HostSession, plan: RunPlan, run_dir: RunDir, show_progress: bool) -> None:
    """Put the plan's image on every node of a runtime that runs one: streamed from the local engine where
    missing or different (a second run ships nothing), or pulled from the registry (plan.pull_image)."""
    image = plan.image
    if image is None:
        return
    from launcher.runtimes.image import docker_client

    engine = None if plan.pull_image else docker_client()
    planned = plan.ship.image_id if plan.ship else None
    if engine is not None and planned is not None and (now := local_image_id(engine, image)) != planned:
        raise DdpctlError(f"the local image {image} is {now[:19]}... now, not the {planned[:19]}... the plan ships "
                          "(it was built again since): make the plan again")
    outcomes = ensure_image([session.conn(n.index) for n in plan.nodes], image, engine,
                            pull=plan.pull_image, show_progress=show_progress)
    results = raise_for_errors(outcomes, "image")
    for node, result in zip(plan.nodes, results, strict=True):
        run_dir.event("image", node=node.index, image=image, bytes_sent=result.bytes_sent, skipped=result.skipped,
                      replaced=result.replaced, pulled=result.pulled, image_id=result.image_id)
    # What the nodes ran, for run.json: node 0's image ID (streamed images are verified equal on every node), and
    # where it was pulled from a registry, the digest that names it there.
    digest = registry_digest(image, results[0].repo_digests) if plan.pull_image else None
    run_dir.update_record(image_id=results[0].image_id, **({"image_digest": digest} if digest else {}))


def _cache_key(path: Path) -> str:
    return hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]


def code_cache(source: str | Path) -> str:
    """The host's code cache (from its home folder) for what is shipped from `source`, a local directory."""
    return f"{CODE_CACHE}/{_cache_key(Path(source))}"


def workspace_before_start(plan: RunPlan) -> bool:
    """Whether something is written into a node's workspace before its start (an MPI job's SSH access files on
    node 0): the code is then copied into the workspaces when shipped, otherwise by the start itself."""
    return plan.spec.launcher == "mpirun" and plan.spec.nnodes > 1


def probed_listing(label: str, cache: str, data: object) -> Listing | None:
    """The probe's listing of a host's code cache; None where it has none (not asked, or the host could not list
    it within the probe: shipping then lists it itself). HostError when it is malformed."""
    if data is None or (isinstance(data, dict) and "error" in data):
        return None
    return read_listing(label, cache, data)


def ship_code(session: HostSession, plan: RunPlan, run_dir: RunDir, listed: Sequence[object] | None = None) -> None:
    """Send what the plan ships (the trainer, or the user's directory: plan.ship, refused when its files changed
    since) to a per-host cache incrementally; its copy into the run's workspace is the start's (start_nodes), or
    done here when the workspace is needed first (workspace_before_start). A relaunch moves only changed files and
    each run keeps the code it ran. `listed`: each host's cache as the probe listed it (its manifest's JSON data,
launcher/remote/tree_sync.py; None: listed here, as is a malformed one)."""
    if plan.ship is None:
        raise ValueError("a plan on hosts says what it ships (launcher/execute/ship/contents.py)")
    check_unchanged(plan.ship)
    source, dest = Path(plan.ship.source), plan.ship.dest
    if plan.spec.user_command:
        manifest, left_out = outputs.record_shipped(run_dir.path, source)  # what is not an output, for pull_run
        console.print(outputs.shipping_note(source, manifest, left_out), markup=False, highlight=False, soft_wrap=True)
    cache = code_cache(source)

    def ship(index: int) -> dict[str, Any]:
        # Another run shipping the same code to this host's cache at the same moment renames and prunes files
        # under our copy: once it is done the cache is whole again, so a failed attempt is retried.
        for attempt in range(SHIP_ATTEMPTS):
            try:
                given = listed[index] if listed and attempt == 0 else None  # a retry lists the cache again
                return ship_once(index, probed_listing(session.label_of(index), cache, given))
            except DdpctlError:
                if attempt == SHIP_ATTEMPTS - 1:
                    raise
                time.sleep(1 + attempt)
        raise AssertionError("unreachable")

    def ship_once(index: int, listing: Listing | None) -> dict[str, Any]:
        conn = session.conn(index)
        stats = ship_tree(conn, source, cache, python=plan.spec.python, listed=listing)
        if workspace_before_start(plan):
            workspace = plan.nodes[index].workspace
            result = conn.run(["sh", "-c", 'mkdir -p "$1/code$3" && rm -rf "$1/code$3" && cp -R "$2" "$1/code$3"',
                               "ddpctl-copy", workspace, cache, dest], timeout=120)
            if result.exit_code != 0:
                raise DdpctlError(f"could not prepare the workspace: {result.stderr.strip()[:200]}")
        return asdict(stats)

    outcomes = run_on_hosts(list(range(len(plan.nodes))), ship, timeout=600, label=session.label_of)
    for index, stats in enumerate(raise_for_errors(outcomes, "ship")):
        run_dir.event("shipped", node=index, **stats)
