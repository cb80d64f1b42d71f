"""A property of the pull, over generated trees on a test bed host: whatever the tree holds (odd modes, names that
are not UTF-8 or fill NAME_MAX, links, FIFOs, empty and larger files, folders nobody can list or enter) and
whatever changes while it is pulled (a file deleted, rewritten, made unreadable or turned into a folder), the
pull never aborts, everything it could read comes back verified (sha256 of what the host listed), and
everything else is named. One bed and one connection serve every example."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infra.testbed import Testbed, cleanup_stale
from launcher.transport.pull import pull_tree
from launcher.transport.ssh import Connection
from launcher.transport.sync import PART_MARK
from tests.testbed_fixtures import TESTBED_SKIP_REASON, TESTBED_UNAVAILABLE, connect

pytestmark = [pytest.mark.testbed, pytest.mark.skipif(TESTBED_UNAVAILABLE, reason=TESTBED_SKIP_REASON)]

NAME_BYTES = st.sampled_from([b"a", b"b", b"Z", b"0", b" ", b"-", "é".encode(), b"\xe9", b"\xff", b"\x80"])
NAMES = st.one_of(st.lists(NAME_BYTES, min_size=1, max_size=6).map(b"".join),
                  st.sampled_from([b"L" * 249, b"M" * 255, "é".encode() * 127]))
FILE_MODES = st.sampled_from([0o644, 0o600, 0o444, 0o000])
DIR_MODES = st.sampled_from([0o755, 0o700, 0o000, 0o300, 0o600])  # 300: enter, not list; 600: list, not enter
SIZES = st.sampled_from([0, 1, 100, 70_000, 300_000])


@dataclass
class Node:
    kind: str  # file, dir, link, fifo
    mode: int = 0o644
    size: int = 0
    children: dict[bytes, Node] = field(default_factory=dict)


def trees(depth: int = 2) -> st.SearchStrategy[dict[bytes, Node]]:
    leaves = st.one_of(st.builds(Node, st.just("file"), FILE_MODES, SIZES),
                       st.builds(Node, st.just("link")), st.builds(Node, st.just("fifo")))
    if depth == 0:
        return st.dictionaries(NAMES, leaves, max_size=4)
    folders = st.builds(Node, st.just("dir"), DIR_MODES, st.just(0), trees(depth - 1))
    return st.dictionaries(NAMES, st.one_of(leaves, leaves, folders), max_size=5)


CHANGES = st.sampled_from(["delete", "rewrite", "unreadable", "to-folder", "none"])


def build(root: bytes, tree: dict[bytes, Node], sums: dict[bytes, str], counter: list[int]) -> None:
    """Make `tree` under root (as root, modes applied deepest first by the caller); sums: rel bytes -> sha256."""
    for name, node in tree.items():
        path = root + b"/" + name
        if node.kind == "file":
            counter[0] += 1
            data = hashlib.sha256(path + bytes(counter)).digest() * (node.size // 32 + 1)
            with open(path, "wb") as f:
                f.write(data[:node.size])
            sums[path] = hashlib.sha256(data[:node.size]).hexdigest()
        elif node.kind == "dir":
            os.mkdir(path)
            build(path, node.children, sums, counter)
        elif node.kind == "link":
            os.symlink(b"/etc/passwd", path)
        else:
            os.mkfifo(path)


def apply_modes(root: bytes, tree: dict[bytes, Node]) -> None:
    for name, node in tree.items():
        path = root + b"/" + name
        if node.kind == "dir":
            apply_modes(path, node.children)
        if node.kind in ("file", "dir"):
            os.chmod(path, node.mode)


def readable(root: bytes, tree: dict[bytes, Node], base: bytes = b"") -> Iterator[bytes]:
    """Paths (relative, bytes) of the files the login user can read: mode allows and every folder above it can be
    listed and entered."""
    for name, node in tree.items():
        rel = base + name
        if node.kind == "file" and node.mode & 0o400:
            yield rel
        elif node.kind == "dir" and node.mode & 0o500 == 0o500:
            yield from readable(root, node.children, rel + b"/")


@pytest.fixture(scope="module")
def host_conn() -> Iterator[tuple[Testbed, Connection]]:
    cleanup_stale("ddpprop")
    bed = Testbed("ddpprop", n_hosts=1)
    try:
        with connect(bed, bed.hosts[0]) as conn:
            yield bed, conn
    finally:
        bed.stop()


@settings(max_examples=60, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(tree=trees(), change=CHANGES, change_index=st.integers(0, 50))
def test_the_pull_never_aborts_brings_back_what_it_can_and_names_the_rest(host_conn, tree, change, change_index):
    bed, conn = host_conn
    host = bed.hosts[0]
    remote = Path(host.home) / "prop"
    shutil.rmtree(remote, ignore_errors=True)
    remote.mkdir()
    sums: dict[bytes, str] = {}
    build(os.fsencode(remote), tree, sums, [0])
    for top, dirs, files in os.walk(remote):
        for name in dirs + files:
            os.lchown(os.path.join(top, name), *_ids(host.home))
    os.chown(remote, *_ids(host.home))
    apply_modes(os.fsencode(remote), tree)
    pullable = sorted(readable(os.fsencode(remote), tree))
    target = pullable[change_index % len(pullable)] if pullable and change != "none" else None
    meddled: list[bytes] = []

    def meddle(_path: str, _done: int) -> None:
        if target is None or meddled:
            return
        full = os.fsencode(remote) + b"/" + target
        meddled.append(target)
        if change == "delete":
            os.unlink(full)
        elif change == "rewrite":
            with open(full, "wb") as f:
                f.write(b"rewritten while pulled")
        elif change == "unreadable":
            os.chmod(full, 0)
        else:
            os.unlink(full)
            os.mkdir(full)

    with tempfile.TemporaryDirectory() as local:
        dest = Path(local) / "node"
        stats = pull_tree(conn, "prop", dest, progress=meddle)  # never raises: that is the property's first part
        named = {path for path, _why in stats.not_pulled}
        for rel in pullable:
            local_name = rel.decode("utf-8", "backslashreplace")
            copy = dest / local_name
            listed_sum = sums[os.fsencode(remote) + b"/" + rel]
            if rel in meddled:  # changed after the listing: either its listed bytes came back, or it is named
                assert (copy.is_file() and _sha(copy) == listed_sum) or local_name in named
                continue
            assert copy.is_file(), (local_name, stats)
            assert _sha(copy) == listed_sum
        # What could not be read is named: each unreadable file, or the folder above it that could not be listed.
        for rel in _unreadable(tree):
            shown = rel.decode("utf-8", "backslashreplace")
            assert any(shown == n or shown.startswith(n + "/") for n in named), (shown, named)
        assert stats.verified == len([p for p in Path(local).rglob("*") if p.is_file()])
        assert not [p for p in Path(local).rglob("*") if PART_MARK in p.name]
    for top, dirs, _files in os.walk(remote):  # let the next example remove this tree
        for name in dirs:
            os.chmod(os.path.join(top, name), 0o755)
    shutil.rmtree(remote)


def _unreadable(tree: dict[bytes, Node], base: bytes = b"") -> Iterator[bytes]:
    """Files that cannot be read, and the first folder on each path that cannot be listed or entered."""
    for name, node in tree.items():
        rel = base + name
        if node.kind == "file" and not node.mode & 0o400:
            yield rel
        elif node.kind == "dir":
            if node.mode & 0o400 == 0 and node.children:
                yield rel
            elif node.mode & 0o100 == 0:
                yield from (rel + b"/" + child for child in node.children)
            else:
                yield from _unreadable(node.children, rel + b"/")


def _ids(home: str) -> tuple[int, int]:
    st_home = os.stat(home)
    return st_home.st_uid, st_home.st_gid


def _sha(path: Path) -> str:
    assert stat.S_ISREG(path.lstat().st_mode)
    return hashlib.sha256(path.read_bytes()).hexdigest()
