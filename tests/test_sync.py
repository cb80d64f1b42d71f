"""launcher.transport.sync against real hosts of the test bed: incremental ship, verified pull, hostile hosts."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.errors import HostError, SpecError
from launcher.transport import outputs
from launcher.transport.pull import pull_tree
from launcher.transport.sync import PART_MARK, ship_tree
from tests.testbed_fixtures import connect

pytestmark = pytest.mark.testbed

QUOTED = "it's a \"quoted\" name.txt"

# Makes files on the host: argv = root, then JSON {relative path: size}; content is deterministic per path.
MAKE_FILES = r"""
import json, os, sys, hashlib
root, files = sys.argv[1], json.loads(sys.argv[2])
for rel, size in files.items():
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    seed = hashlib.sha256(rel.encode()).digest()
    with open(path, "wb") as f:
        f.write((seed * (size // 32 + 1))[:size])
"""
# Prints {relative path: sha256} of every file under argv[1], computed on the host.
SUMS = r"""
import hashlib, json, os, sys
out = {}
for top, _, files in os.walk(sys.argv[1]):
    for name in files:
        p = os.path.join(top, name)
        out[os.path.relpath(p, sys.argv[1])] = hashlib.sha256(open(p, "rb").read()).hexdigest()
print(json.dumps(out))
"""


def remote_sums(conn, root: str) -> dict[str, str]:
    return json.loads(conn.check(["python3", "-c", SUMS, root], "sums").stdout)


def local_sums(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in root.rglob("*") if p.is_file()}


def make_remote(host, root: str, files: dict[str, int]) -> None:
    host.run_as_user(["python3", "-c", MAKE_FILES, root, json.dumps(files)])


def test_ship_is_incremental_and_honours_ignore_files(testbed, tmp_path):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "__pycache__").mkdir()
    (src / "data").mkdir()
    (src / "train.py").write_text("".join(f"line {i}\n" for i in range(200)))
    (src / "pkg" / "model.py").write_text("x = 1\n")
    (src / "pkg" / QUOTED).write_text("quoted\n")
    (src / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (src / "run.sh").chmod(0o755)
    (src / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0" * 100)
    (src / "data" / "big.bin").write_bytes(b"\1" * 100_000)
    (src / "notes.log").write_text("log\n")
    (src / ".gitignore").write_text("*.log\n")
    (src / ".ddpctlignore").write_text("data/\n")
    remote = "ws ship/code"
    with connect(testbed, testbed.hosts[0]) as conn:
        first = ship_tree(conn, src, remote)
        shipped = {"train.py", "pkg/model.py", f"pkg/{QUOTED}", "run.sh", ".gitignore", ".ddpctlignore"}
        assert (first.files_sent, first.files_unchanged) == (len(shipped), 0)
        sums = remote_sums(conn, remote)
        assert set(sums) == shipped
        assert sums == {k: v for k, v in local_sums(src).items() if k in shipped}
        assert conn.run(["./run.sh"], cwd=remote).stdout == "hi\n"  # the executable bit travelled

        again = ship_tree(conn, src, remote)
        assert (again.files_sent, again.bytes_sent, again.files_unchanged) == (0, 0, len(shipped))

        lines = (src / "train.py").read_text().splitlines(keepends=True)
        lines[100] = "line 100 changed\n"
        (src / "train.py").write_text("".join(lines))
        changed = ship_tree(conn, src, remote)
        assert (changed.files_sent, changed.bytes_sent) == (1, (src / "train.py").stat().st_size)
        assert remote_sums(conn, remote)["train.py"] == local_sums(src)["train.py"]

        (src / "pkg" / "model.py").unlink()
        (src / "pkg" / QUOTED).unlink()
        pruned = ship_tree(conn, src, remote)
        assert (pruned.files_sent, pruned.files_deleted) == (0, 2)
        assert set(remote_sums(conn, remote)) == shipped - {"pkg/model.py", f"pkg/{QUOTED}"}
        assert conn.run(["test", "-e", "pkg"], cwd=remote).exit_code == 1  # emptied directory removed


def test_pull_fetches_then_moves_nothing(testbed, tmp_path):
    host = testbed.hosts[1]
    files = {"out/timing.jsonl": 500, "out/snapshots/epoch 1.pt": 300_000, f"out/{QUOTED}": 10,
             "logs/attempt_0/0/stdout.log": 2_000, "out/empty": 0}
    make_remote(host, "ws pull", files)
    dest = tmp_path / "nodes" / "0"
    with connect(testbed, host) as conn:
        first = pull_tree(conn, "ws pull", dest)
        assert (first.files_fetched, first.bytes_fetched, first.verified) == (5, sum(files.values()), 5)
        assert local_sums(dest) == remote_sums(conn, "ws pull")
        second = pull_tree(conn, "ws pull", dest)
        assert (second.files_fetched, second.bytes_fetched, second.files_unchanged) == (0, 0, 5)
        make_remote(host, "ws pull", {"out/timing.jsonl": 700})
        third = pull_tree(conn, "ws pull", dest)
        assert (third.files_fetched, third.bytes_fetched) == (1, 700)
        assert local_sums(dest) == remote_sums(conn, "ws pull")
        only_logs = pull_tree(conn, "ws pull", tmp_path / "logs-only", include=["logs/"])
        assert only_logs.files_fetched == 1 and (tmp_path / "logs-only/logs/attempt_0/0/stdout.log").is_file()
        with pytest.raises(HostError, match="does not exist"):
            pull_tree(conn, "no such dir", tmp_path / "x")
        assert pull_tree(conn, "no such dir", tmp_path / "x", missing_ok=True).files_fetched == 0


def test_interrupted_pull_leaves_no_partial_file_and_next_pull_completes(testbed, tmp_path):
    host = testbed.hosts[0]
    files = {"a.bin": 200_000, "b.bin": 400_000, "c.bin": 1_000}
    make_remote(host, "ws interrupted", files)
    dest = tmp_path / "dest"

    def interrupt(path: str, done: int) -> None:
        if path == "b.bin" and done > 0:
            raise KeyboardInterrupt  # the user pressed Ctrl-C in the middle of b.bin

    with connect(testbed, host) as conn:
        with pytest.raises(KeyboardInterrupt):
            pull_tree(conn, "ws interrupted", dest, progress=interrupt)
        assert sorted(p.name for p in dest.iterdir()) == ["a.bin"]  # b.bin neither final nor as a temporary
        stats = pull_tree(conn, "ws interrupted", dest)
        assert (stats.files_fetched, stats.files_unchanged, stats.bytes_fetched) == (2, 1, 401_000)
        assert local_sums(dest) == remote_sums(conn, "ws interrupted")


KILLED_PULL = r"""
import os, signal, sys
from pathlib import Path
from launcher.spec.hosts import parse_host
from launcher.transport.known_hosts import KnownHosts
from launcher.transport.ssh import Connection, resolve_target
from launcher.transport.pull import pull_tree
spec, key, known, dest = sys.argv[1:5]
target = resolve_target(parse_host(spec), ssh_config=Path("/nonexistent"), identity_file=Path(key))
conn = Connection(target, known_hosts=KnownHosts(Path(known), Path("/nonexistent")), allow_agent=False)
def die(path, done):
    if path == "b.bin" and done >= 65536:
        os.kill(os.getpid(), signal.SIGKILL)  # the launcher machine loses power mid-file
pull_tree(conn, "ws killed", Path(dest), progress=die)
"""


def test_killed_pull_resumes_and_cleans_its_temporary_file(testbed, tmp_path):
    host = testbed.hosts[1]
    make_remote(host, "ws killed", {"a.bin": 100_000, "b.bin": 500_000})
    dest = tmp_path / "dest"
    proc = subprocess.run([sys.executable, "-c", KILLED_PULL, host.spec, testbed.client_key_path,
                           str(testbed.known_hosts_path), str(dest)],
                          cwd=Path(__file__).parent.parent, capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    names = sorted(p.name for p in dest.iterdir())
    assert len(names) == 2 and names[0].startswith(".b.bin" + PART_MARK) and names[1] == "a.bin"
    with connect(testbed, host) as conn:
        stats = pull_tree(conn, "ws killed", dest)
        assert (stats.files_fetched, stats.files_unchanged) == (1, 1)
        assert local_sums(dest) == remote_sums(conn, "ws killed")
    assert sorted(p.name for p in dest.iterdir()) == ["a.bin", "b.bin"]


def test_symlink_on_host_is_not_followed_and_special_files_skipped(testbed, tmp_path):
    host = testbed.hosts[0]
    make_remote(host, "ws evil link", {"out/ok.txt": 10})
    host.run_as_user(["ln", "-s", "/etc/passwd", "ws evil link/out/passwd"])
    host.run_as_user(["ln", "-s", "/etc", "ws evil link/out/etc"])
    host.run_as_user(["mkfifo", "ws evil link/out/fifo"])
    dest = tmp_path / "dest"
    with connect(testbed, host) as conn:
        stats = pull_tree(conn, "ws evil link", dest)
    assert (stats.files_fetched, stats.skipped_special) == (1, 1)
    assert sorted(stats.skipped_links) == ["out/etc", "out/passwd"]
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*")) == ["out", "out/ok.txt"]


def test_local_symlink_cannot_redirect_a_pull_outside(testbed, tmp_path):
    host = testbed.hosts[0]
    make_remote(host, "ws redirect", {"out/x.txt": 5})
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "out").symlink_to(outside)
    with connect(testbed, host) as conn, pytest.raises(HostError, match="leads outside"):
        pull_tree(conn, "ws redirect", dest)
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("evil_path", ["../escaped.txt", "out/../../escaped.txt", "/tmp/escaped.txt", "a//b"])
def test_lying_host_cannot_write_outside(testbed, tmp_path, evil_path):
    """A compromised host answers the manifest with an escaping path: refused before anything is written."""
    host = testbed.hosts[1]
    fake = Path(host.home, "evilbin", "python3")
    fake.parent.mkdir(exist_ok=True)
    manifest = {"exists": True, "entries": [
        {"path": "good.txt", "type": "file", "size": 3, "sha256": hashlib.sha256(b"abc").hexdigest()},
        {"path": evil_path, "type": "file", "size": 3, "sha256": hashlib.sha256(b"abc").hexdigest()}]}
    fake.write_text(f"#!/bin/sh\ncat <<'EOF'\n{json.dumps(manifest)}\nEOF\n")
    fake.chmod(0o755)
    os.chown(fake.parent, *(_ids(host.user)))
    host.set_ssh_environment({"PATH": f"{fake.parent}:/usr/bin:/bin"})
    dest = tmp_path / "dest"
    try:
        with connect(testbed, host) as conn, pytest.raises(HostError) as refused:
            pull_tree(conn, "anything", dest)
    finally:
        host.set_ssh_environment({})
    assert "escapes the directory" in str(refused.value) and repr(evil_path) in str(refused.value)
    assert not dest.exists()
    assert not (tmp_path / "escaped.txt").exists() and not Path("/tmp/escaped.txt").exists()


def _ids(user: str) -> tuple[int, int]:
    import pwd

    entry = pwd.getpwnam(user)
    return entry.pw_uid, entry.pw_gid


# -- a user script's outputs (launcher/transport/outputs.py) -------------------------------------------------------

def test_pull_leaves_out_what_was_shipped_unchanged_and_interpreter_caches(testbed, tmp_path):
    src = tmp_path / "project"
    (src / "sub").mkdir(parents=True)
    (src / "train.py").write_text("print(1)\n")
    (src / "sub" / "data.csv").write_text("a,b\n")
    (src / "notes.txt").write_text("v1\n")
    run_path = tmp_path / "run"
    run_path.mkdir()
    outputs.record_shipped(run_path, src)
    shipped = outputs.load_shipped(run_path)
    assert shipped == {rel: hashlib.sha256((src / rel).read_bytes()).hexdigest()
                       for rel in ("train.py", "sub/data.csv", "notes.txt")}
    host = testbed.hosts[0]
    with connect(testbed, host) as conn:
        ship_tree(conn, src, "ws outputs/code")
        make_remote(host, "ws outputs/code", {"snapshot.pt": 5_000, "sub/result.csv": 40, "notes.txt": 7,
                                              "__pycache__/train.cpython-311.pyc": 90, "big/scratch.bin": 9_000})
        everything = outputs.pull_workdir(conn, "ws outputs", tmp_path / "node", shipped, (), "python3")
        assert set(local_sums(tmp_path / "node" / "workdir")) == {"snapshot.pt", "sub/result.csv", "notes.txt",
                                                                  "big/scratch.bin"}
        assert local_sums(tmp_path / "node" / "workdir")["snapshot.pt"] == remote_sums(
            conn, "ws outputs/code")["snapshot.pt"]
        assert (everything.files_fetched, everything.verified) == (4, 4)
        narrowed = outputs.pull_workdir(conn, "ws outputs", tmp_path / "narrow", shipped, ("*.pt", "sub/"),
                                        "python3")
        assert set(local_sums(tmp_path / "narrow" / "workdir")) == {"snapshot.pt", "sub/result.csv"}
        assert narrowed.files_fetched == 2


def test_shipping_note_names_ignored_folders_and_big_files(tmp_path):
    src = tmp_path / "project"
    for folder in ("data", "ckpt", "wandb", "tiny"):
        (src / folder).mkdir(parents=True)
    (src / "data" / "train.bin").write_bytes(b"\0" * 3_000_000)
    (src / "data" / "test.bin").write_bytes(b"\0" * 1_000_000)
    (src / "ckpt" / "a.pt").write_bytes(b"\0" * 2_000_000)
    (src / "wandb" / "log").write_bytes(b"\0" * 10)
    (src / "tiny" / "x").write_bytes(b"\0" * 5)
    (src / "model.onnx").write_bytes(b"\0" * 1_500_000)
    (src / "debug.log").write_text("small: not named\n")
    (src / ".git").mkdir()  # left out by ddpctl's own defaults: not news
    (src / ".git" / "pack").write_bytes(b"\0" * 5_000_000)
    (src / "train.py").write_text("print(1)\n")
    (src / ".gitignore").write_text("data/\nckpt/\nwandb/\n*.onnx\n*.log\n")
    (src / ".ddpctlignore").write_text("tiny/\n")
    run_path = tmp_path / "run"
    run_path.mkdir()
    manifest, left_out = outputs.record_shipped(run_path, src)
    assert set(manifest) == {"train.py", ".gitignore", ".ddpctlignore"}
    assert [item.path for item in left_out] == ["data/", "ckpt/", "model.onnx", "wandb/", "tiny/"]
    note = outputs.shipping_note(src, manifest, left_out)
    assert "\n" not in note
    shipped = sum(size for size, _sha, _mode in manifest.values())
    assert note == (f"shipping 3 files ({shipped} B) of {src} to each node; left out by .gitignore/.ddpctlignore: "
                    "data/ (2 files, 4.0 MB), ckpt/ (1 file, 2.0 MB), model.onnx (1.5 MB) and 2 more; "
                    "a .ddpctlignore line `!data/` ships it")
    (src / ".ddpctlignore").write_text("tiny/\n!data/\n")  # the line the note gave brings the folder back
    manifest, left_out = outputs.record_shipped(run_path, src)
    assert {"data/train.bin", "data/test.bin"} <= set(manifest) and "data/" not in [i.path for i in left_out]
    quiet = tmp_path / "quiet"
    quiet.mkdir()
    (quiet / "a.py").write_text("x")
    manifest, left_out = outputs.record_shipped(run_path, quiet)
    assert outputs.shipping_note(quiet, manifest, left_out) == f"shipping 1 file (1 B) of {quiet} to each node"


def test_shipping_note_names_state_files_and_the_line_that_leaves_them_out(tmp_path):
    """A snapshot.pt a local try left, a checkpoints folder and saved weights are shipped: a script that resumes
    from what it finds would resume from them on the hosts, so the shipping line names them (issue 22)."""
    src = tmp_path / "project"
    (src / "checkpoints" / "epoch-2").mkdir(parents=True)
    (src / "checkpoints" / "epoch-2" / "model.bin").write_bytes(b"w")
    (src / "models").mkdir()
    (src / "models" / "best.pth").write_bytes(b"w")
    for name in ("snapshot.pt", "last.ckpt", "train.py", "notes.txt"):
        (src / name).write_bytes(b"x")
    run_path = tmp_path / "run"
    run_path.mkdir()
    manifest, left_out = outputs.record_shipped(run_path, src)
    note = outputs.shipping_note(src, manifest, left_out)
    assert "\n" not in note
    assert note.endswith("to each node; also shipped, and a script resuming from what it finds resumes from it: "
                         "checkpoints/, last.ckpt, models/best.pth and 1 more (a .ddpctlignore line `checkpoints/` "
                         "leaves it out)"), note
    (src / ".ddpctlignore").write_text("checkpoints/\n*.pt\n*.pth\n*.ckpt\n")  # what the line says to write
    manifest, left_out = outputs.record_shipped(run_path, src)
    assert "also shipped" not in outputs.shipping_note(src, manifest, left_out)
    assert set(manifest) == {"train.py", "notes.txt", ".ddpctlignore"}


def test_rank0_node_follows_c10d_order_and_the_top_gets_its_copy(tmp_path):
    # c10d ranks nodes by their descriptors, compared as strings: "10.0.0.10" comes before "10.0.0.9".
    record = {"nodes": [{"address": "10.0.0.9"}, {"address": "10.0.0.10"}]}
    assert outputs.rank0_node(record, None) == 1
    assert outputs.rank0_node({"nodes": [{"address": "x"}]}, None) == 0
    assert outputs.rank0_node(record, tmp_path / "nodes" / "0" / "out") == 0  # our trainer's own records decide
    for k in (0, 1):
        work = tmp_path / "nodes" / str(k) / "workdir"
        (work / "sub").mkdir(parents=True)
        (work / "snapshot.pt").write_text(f"node {k}")
        (work / "sub" / "m.csv").write_text(f"m {k}")
        (work / "link").symlink_to("snapshot.pt")
        (tmp_path / "nodes" / str(k) / "out").mkdir()
        (tmp_path / "nodes" / str(k) / "out" / "result.json").write_text(f"{k}")
    outputs.mirror_rank0(tmp_path, 1)
    assert (tmp_path / "workdir" / "snapshot.pt").read_text() == "node 1"
    assert (tmp_path / "workdir" / "sub" / "m.csv").read_text() == "m 1"
    assert (tmp_path / "out" / "result.json").read_text() == "1"
    assert not os.path.lexists(tmp_path / "workdir" / "link")
    (tmp_path / "nodes" / "1" / "workdir" / "snapshot.pt").unlink()  # a newer pull replaces the file
    (tmp_path / "nodes" / "1" / "workdir" / "snapshot.pt").write_text("node 1, later")
    outputs.mirror_rank0(tmp_path, 1)
    assert (tmp_path / "workdir" / "snapshot.pt").read_text() == "node 1, later"


@pytest.mark.parametrize("patterns, command, message", [
    (["*.pt"], None, "--outputs narrows what comes back of your own script's working directory: it needs `-- CMD`"),
    (["!*.pt"], ["python", "t.py"], "--outputs '!*.pt': give a gitignore-style pattern"),
    ([" "], ["python", "t.py"], "--outputs ' ': give a gitignore-style pattern"),
])
def test_outputs_patterns_are_checked(patterns, command, message):
    with pytest.raises(SpecError) as refused:
        outputs.check_outputs_option(patterns, command)
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)
