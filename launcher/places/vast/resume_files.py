"""What a replacement machine starts from after an interruption, and putting it there before the run starts again.

The built-in trainer: the newest end-of-epoch snapshot whose checksum holds, among everything pulled of the run
(the final pulls of the machines that survived, nodes/<k>/out/snapshots, what was pulled while it trained,
live/<k>/out/snapshots, and the same of earlier lost sets under interrupted/<n>/), goes to every node's
out/snapshots/: every rank resumes from that one snapshot, after its epoch (trainer/trainer.py, as after a
torchrun restart). A script (`-- CMD`): node k's out/ as last pulled goes back to the new node k's out/, where the
script finds its own checkpoint as it left it (docs/guides/vast.md)."""

from __future__ import annotations

import hashlib
import re
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from launcher.errors import DdpctlError
from launcher.planning.plan import remote_workspace
from launcher.results.rundir import RunDir
from launcher.transport.hostsession import HostSession
from launcher.transport.parallel import raise_for_errors, run_on_hosts
from launcher.transport.sync import ship_tree

# trainer/snapshot.py's format: a header line with the payload's sha256, then the payload; end-of-epoch names only.
SNAPSHOT_MAGIC = b"DDPCTL-SNAPSHOT 1 sha256="
EPOCH_SNAPSHOT = re.compile(r"^snapshot-epoch-(\d{6,})\.pt$")


def snapshot_holds(path: Path) -> bool:
    """Whether a snapshot file's checksum holds (a truncated or torn copy does not)."""
    try:
        with path.open("rb") as fh:
            header = fh.readline()
            if not header.startswith(SNAPSHOT_MAGIC):
                return False
            digest = hashlib.sha256()
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    except OSError:
        return False
    return header[len(SNAPSHOT_MAGIC):].strip().decode(errors="replace") == digest.hexdigest()


def newest_snapshot(folders: Iterable[Path]) -> tuple[int, Path] | None:
    """(epoch, path) of the newest end-of-epoch snapshot in `folders` whose checksum holds; None if none."""
    found: list[tuple[int, Path]] = []
    for folder in folders:
        if folder.is_dir():
            found += [(int(m.group(1)), p) for p in folder.iterdir() if (m := EPOCH_SNAPSHOT.match(p.name))]
    for epoch, path in sorted(found, key=lambda item: (-item[0], str(item[1]))):
        if snapshot_holds(path):
            return epoch, path
    return None


def _pulled_roots(run_dir: RunDir) -> list[Path]:
    """Where pulled node files are, newest first: this set's (the run directory), then each lost set's
    (interrupted/<n>/, launcher/places/vast/interruptible_chain.py), the latest first."""
    lost = sorted((p for p in (run_dir.path / "interrupted").glob("*") if p.name.isdigit()),
                  key=lambda p: -int(p.name))
    return [run_dir.path, *lost]


def snapshot_folders(run_dir: RunDir) -> list[Path]:
    """Every folder of the run directory that holds pulled snapshots: final pulls, live pulls, lost sets'."""
    return [folder for root in _pulled_roots(run_dir) for kind in ("nodes", "live")
            for folder in sorted((root / kind).glob("*/out/snapshots"))]


def script_out(run_dir: RunDir, node: int) -> Path | None:
    """Node `node`'s out/ as last pulled: a surviving machine's final pull (newer) over the live pull, this set's
    over a lost set's."""
    for root in _pulled_roots(run_dir):
        for folder in (root / "nodes" / str(node) / "out", root / "live" / str(node) / "out"):
            if folder.is_dir() and any(folder.iterdir()):
                return folder
    return None


def ship_resume_files(session: HostSession, run_dir: RunDir, python: str, script: bool) -> tuple[str, int | None]:
    """Put what the run resumes from on every node of `session` (before it starts): what, in words, and the epoch
    of the snapshot (None: a script's files, or no snapshot)."""
    workspace = remote_workspace(run_dir.run_id)
    nodes = list(range(len(session.targets)))
    with tempfile.TemporaryDirectory(prefix="ddpctl-resume-") as tmp:
        if script:
            epoch = None
            sources = {k: script_out(run_dir, k) for k in nodes}
            said = (f"each node's out/ as last pulled (nodes {[k for k, s in sources.items() if s]})"
                    if any(sources.values()) else "nothing (no output was pulled before the loss)")
            targets = {k: (s, f"{workspace}/out") for k, s in sources.items() if s is not None}
        else:
            newest = newest_snapshot(snapshot_folders(run_dir))
            if newest is None:
                return "from the start (no snapshot had been pulled)", None
            epoch, path = newest
            folder = Path(tmp) / "snapshots"
            folder.mkdir()
            shutil.copy2(path, folder / path.name)
            said = f"after epoch {epoch} ({path.name})"
            targets = {k: (folder, f"{workspace}/out/snapshots") for k in nodes}
        outcomes = run_on_hosts(list(targets), lambda k: ship_tree(session.conn(k), targets[k][0], targets[k][1],
                                                                    python=python), timeout=1800,
                                label=session.label_of)
        try:
            raise_for_errors(outcomes, "ship the files to resume from")
        except DdpctlError as exc:
            raise DdpctlError(f"could not put what the run resumes from on the new machines: {exc}") from None
    run_dir.event("vast.resume_files_shipped", what=said, nodes=sorted(targets))
    return said, None if script else epoch
