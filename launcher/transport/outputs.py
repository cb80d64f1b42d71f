"""A user script's outputs (`ddpctl up --host ... -- CMD`): what it wrote in its working directory on each node,
told apart from what was shipped there, and pulled back by the same rules as everything else (launcher/transport/
sync.py: incremental, sha256-verified, confined, links named and left out); and the shipping note that says what
.gitignore / .ddpctlignore left out.

On a node the script runs in the workspace's `code/` (the shipped copy of the user's directory). The ship step
records the sha256 of every file it shipped (SHIPPED_FILE in the run directory), so any file there that is new or
differs from its shipped bytes is an output: it lands in `nodes/<k>/workdir/`. The output folder the script is
told about (OUTPUT_DIR_ENV, the workspace's `out/`) comes back whole into `nodes/<k>/out/`, as for our trainer.
The node that held global rank 0 gets its copy of both mirrored at the top of the run directory (`workdir/`,
`out/`)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from launcher.errors import SpecError
from launcher.transport.pathspec_loader import pathspec
from launcher.transport.pull import PullStats, pull_tree
from launcher.transport.ssh import Connection
from launcher.transport.state_files import state_note
from launcher.transport.sync import (
    DEFAULT_IGNORE,
    IGNORE_FILES,
    RemoteEntry,
    file_sha256,
    ignore_spec,
    local_manifest,
    part_name,
)

# The environment variable naming the run's output folder to the user's script (hosts: the workspace's out/,
# pulled to nodes/<k>/out/; locally: runs/<id>/out/).
OUTPUT_DIR_ENV = "DDPCTL_OUTPUT_DIR"
# In the run directory: {"files": {relative path: sha256}} of what was shipped as the script's working directory.
SHIPPED_FILE = "shipped.json"
# Where a node's working-directory outputs land (nodes/<k>/WORKDIR) and rank 0's node's copy (runs/<id>/WORKDIR).
WORKDIR = "workdir"
OUT = "out"
# Written by the interpreter, not the script (imports of the shipped modules): never outputs.
INTERPRETER_CACHES = ("__pycache__/", "*.pyc")
# Files at least this big that the ignore files leave out are named in the shipping note.
BIG_FILE_BYTES = 1 << 20
NOTE_NAMES = 3  # left-out items named in the note; the rest are counted


def check_outputs_option(patterns: Sequence[str], command: Sequence[str] | None) -> None:
    """--outputs narrows what comes back of a `-- CMD` script's working directory: refuse it without one, and
    refuse patterns that cannot match a relative path."""
    if patterns and not command:
        raise SpecError("--outputs narrows what comes back of your own script's working directory: it needs "
                        "`-- CMD` (ddpctl's trainer writes only to its output folder, which always comes back)")
    for pattern in patterns:
        if not pattern.strip() or pattern.startswith("!") or "\x00" in pattern:
            raise SpecError(f"--outputs {pattern!r}: give a gitignore-style pattern of the files to bring back, "
                            "relative to the script's working directory, e.g. --outputs 'snapshot.pt' or "
                            "--outputs 'checkpoints/'")


# -- what was shipped, and the note about what was not -------------------------------------------------------

@dataclass(frozen=True)
class LeftOut:
    """A folder or big file the user's ignore files keep from the hosts."""

    path: str  # relative, folders ending in "/"
    files: int
    size: int


def record_shipped(run_path: Path, source: Path) -> tuple[dict[str, tuple[int, str, int]], list[LeftOut]]:
    """Write SHIPPED_FILE for `source` (what ship_tree sends) into the run directory; return the manifest and what
    the ignore files left out (folders, files over BIG_FILE_BYTES)."""
    spec = ignore_spec(source)
    manifest = local_manifest(source, spec)
    files = {rel: sha for rel, (_size, sha, _mode) in manifest.items()}
    tmp = run_path / f".{SHIPPED_FILE}.{secrets.token_hex(4)}"
    tmp.write_text(json.dumps({"files": files, "source": str(source)}, sort_keys=True) + "\n")
    os.replace(tmp, run_path / SHIPPED_FILE)
    return manifest, left_out_by_ignore_files(source, spec)


def left_out_by_ignore_files(source: Path, spec: pathspec.PathSpec) -> list[LeftOut]:
    """Folders and big files that `spec` leaves out but ddpctl's own defaults would not: what the user's
    .gitignore / .ddpctlignore lines keep from the hosts (caches, .git, credentials are not news)."""
    defaults = pathspec.GitIgnoreSpec.from_lines(DEFAULT_IGNORE)
    found: list[LeftOut] = []
    for top, dirs, files in os.walk(source):
        rel_top = os.path.relpath(top, source)
        rel_top = "" if rel_top == "." else rel_top + "/"
        kept = []
        for name in sorted(dirs):
            rel = rel_top + name + "/"
            if os.path.islink(os.path.join(top, name)) or defaults.match_file(rel):
                continue
            if spec.match_file(rel):
                count, size = _tree_size(Path(top, name))
                found.append(LeftOut(rel, count, size))
            else:
                kept.append(name)
        dirs[:] = kept
        for name in sorted(files):
            rel, full = rel_top + name, os.path.join(top, name)
            if name in IGNORE_FILES or defaults.match_file(rel) or not spec.match_file(rel) or os.path.islink(full):
                continue
            size = os.path.getsize(full)
            if size >= BIG_FILE_BYTES:
                found.append(LeftOut(rel, 1, size))
    return sorted(found, key=lambda item: -item.size)


def shipping_note(source: Path, manifest: dict[str, tuple[int, str, int]], left_out: list[LeftOut]) -> str:
    """One line: what is shipped (files, bytes), what of it looks like training state (with the line that leaves
    it out), and, when the ignore files left out folders or big files, the biggest few of them with the
    .ddpctlignore line that ships one again."""
    total = sum(size for size, _sha, _mode in manifest.values())
    line = f"shipping {_count(len(manifest), 'file')} ({_size(total)}) of {source} to each node"
    state = state_note(manifest)
    if state:
        line += f"; {state}"
    if not left_out:
        return line
    named = ", ".join(f"{item.path} ({_count(item.files, 'file') + ', ' if item.path.endswith('/') else ''}"
                      f"{_size(item.size)})" for item in left_out[:NOTE_NAMES])
    more = f" and {len(left_out) - NOTE_NAMES} more" if len(left_out) > NOTE_NAMES else ""
    return (f"{line}; left out by .gitignore/.ddpctlignore: {named}{more}; a .ddpctlignore line "
            f"`!{left_out[0].path}` ships it")


def _tree_size(folder: Path) -> tuple[int, int]:
    count = size = 0
    for top, _dirs, files in os.walk(folder):
        for name in files:
            full = os.path.join(top, name)
            if not os.path.islink(full):
                count += 1
                size += os.path.getsize(full)
    return count, size


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _size(size: int) -> str:
    if size < 1000:
        return f"{size} B"
    return f"{size / 1e3:.1f} kB" if size < 1_000_000 else f"{size / 1e6:.1f} MB"


# -- pulling them back -------------------------------------------------------------------------------------

def load_shipped(run_path: Path) -> dict[str, str] | None:
    """SHIPPED_FILE's {path: sha256}; None when the run shipped no working directory (our trainer, older runs)."""
    try:
        data = json.loads((run_path / SHIPPED_FILE).read_text())
        files = data["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return {str(k): str(v) for k, v in files.items()} if isinstance(files, dict) else None


def not_an_output(shipped: dict[str, str], outputs: Sequence[str] = ()) -> Callable[[RemoteEntry], bool]:
    """The entries of the node's working directory that are not the script's outputs: shipped files still equal
    to what was shipped, interpreter caches, and, with --outputs, whatever matches none of its patterns."""
    caches = pathspec.GitIgnoreSpec.from_lines(INTERPRETER_CACHES)
    wanted = pathspec.GitIgnoreSpec.from_lines(outputs) if outputs else None

    def skip(entry: RemoteEntry) -> bool:
        if entry.type == "file" and shipped.get(entry.path) == entry.sha256:
            return True
        return caches.match_file(entry.path) or (wanted is not None and not wanted.match_file(entry.path))

    return skip


def pull_workdir(conn: Connection, workspace: str, node_dir: Path, shipped: dict[str, str],
                 outputs: Sequence[str], python: str) -> PullStats:
    """Pull what the script wrote in its working directory on one node into node_dir/WORKDIR (verified)."""
    return pull_tree(conn, f"{workspace}/code", node_dir / WORKDIR, missing_ok=True, python=python,
                     exclude=not_an_output(shipped, outputs))


def merged_stats(records: PullStats, written: PullStats) -> dict[str, Any]:
    """One node's pull as the `pulled` event records it: the workspace's records and the working directory's
    outputs together (counts summed, links and files not pulled named by where they would have landed), the latter
    also apart."""
    merged = asdict(records)
    for key in ("files_fetched", "bytes_fetched", "files_unchanged", "verified", "skipped_special"):
        merged[key] += getattr(written, key)
    merged["skipped_links"] = [*records.skipped_links, *(f"{WORKDIR}/{path}" for path in written.skipped_links)]
    for key in ("not_pulled", "escaped"):  # (path, note) pairs
        merged[key] = [*map(list, getattr(records, key)),
                       *([f"{WORKDIR}/{path}", note] for path, note in getattr(written, key))]
    merged[WORKDIR] = asdict(written)
    return merged


def recorded_outputs(record: dict[str, Any]) -> list[str]:
    """The run's --outputs patterns, from run.json's options (so `pull` and `down` narrow as `up` did)."""
    patterns = (record.get("options") or {}).get("outputs") or []
    return [str(p) for p in patterns] if isinstance(patterns, list) else []


def rank0_node(record: dict[str, Any], primary_out: Path | None) -> int:
    """The node that held global rank 0. Our trainer says so in its records (`primary_out`, found by
    results.rundir.primary_node_out); a script need not, so use c10d's own rule: ranks go to the nodes in the
    order of their rendezvous descriptors, which start with the address each node gave as --local-addr."""
    nodes = record.get("nodes") or []
    if primary_out is not None:
        return int(primary_out.parent.name)
    if len(nodes) < 2 or not all(n.get("address") for n in nodes):
        return 0
    return min(range(len(nodes)), key=lambda i: str(nodes[i]["address"]))


def mirror_rank0(run_path: Path, node: int) -> None:
    """Give the top of the run directory node `node`'s copy of the script's outputs (WORKDIR and OUT), linked
    rather than copied where the file system allows (snapshots can be big)."""
    for name in (WORKDIR, OUT):
        source = run_path / "nodes" / str(node) / name
        if not source.is_dir():
            continue
        for top, _dirs, files in os.walk(source):
            for file in files:
                src = Path(top, file)
                if src.is_symlink() or not src.is_file():
                    continue
                _place(src, run_path / name / src.relative_to(source))


def _place(src: Path, dest: Path) -> None:
    if dest.exists() and not dest.is_symlink() and (os.path.samefile(src, dest)
                                                   or file_sha256(src) == file_sha256(dest)):
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / part_name(dest.name)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dest)
