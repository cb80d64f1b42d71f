"""What a run on hosts ships, decided with its plan (`RunPlan.ship`) rather than at run time: the trainer package,
or with `-- CMD` the directory `up` was started in; the digest of the files sent; and for a docker run that
streams the local image, that image's ID. A dry run shows it (and saves it with --save-plan); the executor sends
exactly it, refusing files or an image that changed since (launcher/execute/hosts/run.py)."""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path

from launcher.errors import DdpctlError
from launcher.planning.plan import LOCAL, RunPlan, Shipment
from launcher.spec.run_spec import RunSpec


def with_shipment(plan: RunPlan, cwd: Path, *, dry_run: bool = False) -> RunPlan:
    """`plan` with what it ships (a run on this machine ships nothing). A dry run names what it could not learn
    (no local engine or image) among the plan's unknowns; a run raises it."""
    if plan.ship is not None or all(node.host.label == LOCAL for node in plan.nodes):
        return plan
    from launcher.transport.sync import tree_digest  # paramiko: only a run on hosts ships, and gets here

    source, dest = ship_source(plan.spec, cwd)
    image_id, unknown = None, plan.unknown
    if plan.image and not plan.pull_image:
        try:
            image_id = local_image_id_of(plan.image)
        except DdpctlError as e:
            if not dry_run:
                raise
            unknown = (*unknown, f"image ID: {str(e).splitlines()[0]}")
    ship = Shipment(str(source), dest, tree_digest(source), image_id)
    return replace(plan, ship=ship, unknown=unknown)


def ship_source(spec: RunSpec, cwd: Path) -> tuple[Path, str]:
    """The local directory a run on hosts ships, resolved, and where under the workspace's code/ it goes: with
    `-- CMD` the working directory (to code/ itself), else the trainer package (to code/trainer)."""
    return (cwd.resolve(), "") if spec.user_command else (trainer_source_dir().resolve(), "/trainer")


def local_image_id_of(image: str) -> str:
    """The ID the local Docker engine gives `image`; DdpctlError saying how to build or start what is missing."""
    from launcher.runtimes.docker_hosts import local_image_id
    from launcher.runtimes.image import docker_client

    engine = docker_client()
    try:
        return local_image_id(engine, image)
    finally:
        engine.close()


def check_unchanged(ship: Shipment) -> None:
    """Refuse (one line) files that changed since the plan was made: the run would send other code than it shows."""
    from launcher.transport.sync import tree_digest  # paramiko: only a run on hosts ships

    source = Path(ship.source)
    if not source.is_dir():
        raise DdpctlError(f"the plan ships {source}, which is not a directory any more: make the plan again")
    now = tree_digest(source)
    if now != ship.digest:
        raise DdpctlError(f"the files in {source} changed since the plan was made ({ship.digest[:19]}... then, "
                          f"{now[:19]}... now): make the plan again, or run `ddpctl up` without --plan")


def trainer_source_dir() -> Path:
    """Where the trainer package lives locally (found without importing it: it imports torch)."""
    found = importlib.util.find_spec("trainer")
    if found is None or not found.submodule_search_locations:
        raise DdpctlError("the trainer package is not installed here: run `pip install .` in the ddpctl checkout")
    return Path(next(iter(found.submodule_search_locations)))
