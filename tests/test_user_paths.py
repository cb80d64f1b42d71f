"""Files ddpctl writes where the user said: a regular file or nothing there is written (atomically); a symbolic
link is written through (the link stays); a device, a FIFO, a socket or a directory is refused in one line and
left as it was; never a hang on a FIFO. Folders (--runs-dir, report --out) must be directories or nothing."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from launcher.errors import SpecError
from launcher.results.user_files import write_user_file
from launcher.spec.validate import check_runs_dir
from tests.cli_runner import ddpctl

FULL_DEVICE = os.makedev(1, 7)  # what /dev/full is; made in the test's own folder, never touching /dev


def odd_things(root: Path) -> dict[str, tuple[Path, str]]:
    """Non-regular files (path, what the refusal calls it) made under root."""
    made = {}
    if os.geteuid() == 0:
        os.mknod(root / "full", stat.S_IFCHR | 0o666, FULL_DEVICE)
        made["device"] = (root / "full", "a character device")
    os.mkfifo(root / "fifo")
    made["fifo"] = (root / "fifo", "a FIFO (named pipe)")
    (root / "folder").mkdir()
    made["folder"] = (root / "folder", "a directory")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(root / "sock"))
    server.close()
    made["socket"] = (root / "sock", "a socket")
    return made


def snapshot(path: Path) -> tuple[int, int]:
    st = path.lstat()
    return st.st_mode, st.st_rdev


def test_non_regular_targets_are_refused_in_one_line_and_left_alone(tmp_path: Path) -> None:
    for name, (path, words) in odd_things(tmp_path).items():
        before = snapshot(path)
        with pytest.raises(SpecError) as refused:
            write_user_file(path, b"x = 1\n", "--save-config")
        assert str(refused.value) == (f"--save-config {path} is {words}, not a regular file: give the path of a "
                                      "file to write (it is created, or replaced whole)"), name
        assert snapshot(path) == before, name
        link = tmp_path / f"link-to-{name}"
        link.symlink_to(path)
        with pytest.raises(SpecError) as refused:
            write_user_file(link, b"x = 1\n", "--save-config")
        assert f"--save-config {link} is {words} (the link leads to {path}), not a regular file" in str(refused.value)
        assert link.is_symlink() and snapshot(path) == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary file left


def test_a_symbolic_link_is_written_through_and_stays_a_link(tmp_path: Path) -> None:
    target = tmp_path / "real.toml"
    target.write_text("old\n")
    link = tmp_path / "config.toml"
    link.symlink_to(target)
    assert write_user_file(link, b"new\n", "--save-config") == target
    assert link.is_symlink() and target.read_text() == "new\n"
    dangling = tmp_path / "dangling.toml"
    dangling.symlink_to(tmp_path / "made-by-the-write.toml")
    write_user_file(dangling, b"made\n", "--save-config")
    assert dangling.is_symlink() and (tmp_path / "made-by-the-write.toml").read_text() == "made\n"
    plain = tmp_path / "plain.toml"
    write_user_file(plain, b"one\n", "--save-config")
    write_user_file(plain, b"two\n", "--save-config")
    assert plain.read_text() == "two\n" and not plain.is_symlink()


def test_a_file_in_a_folder_that_does_not_exist_is_refused_and_no_folder_made(tmp_path: Path) -> None:
    missing = tmp_path / "typo" / "deeper" / "c.toml"
    with pytest.raises(SpecError) as refused:
        write_user_file(missing, b"x = 1\n", "--save-config")
    assert str(refused.value) == (f"--save-config {missing}: the folder {missing.parent} does not exist: create it "
                                  "first, or give a path in an existing folder")
    link = tmp_path / "dangling.toml"
    link.symlink_to(tmp_path / "nowhere" / "c.toml")
    with pytest.raises(SpecError) as refused:
        write_user_file(link, b"x = 1\n", "--save-config")
    assert f"the folder {tmp_path / 'nowhere'} does not exist (the link leads to {tmp_path / 'nowhere' / 'c.toml'})" \
        in str(refused.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling.toml"]  # no folder made, the link kept


def test_runs_dir_that_is_not_a_directory_is_named_as_what_it_is(tmp_path: Path) -> None:
    for name, (path, words) in odd_things(tmp_path).items():
        if name == "folder":
            assert check_runs_dir(path) == path
            continue
        with pytest.raises(SpecError) as refused:
            check_runs_dir(path)
        assert str(refused.value) == (f"--runs-dir {path} is {words}, not a directory: give a directory for run "
                                      "directories (it is created if missing)")


@pytest.mark.integration
@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_save_config_on_a_device_is_refused_and_the_device_kept(tmp_path: Path) -> None:
    device = tmp_path / "full"
    os.mknod(device, stat.S_IFCHR | 0o666, FULL_DEVICE)
    result = ddpctl("up", "--dry-run", "--epochs", "1", "--runs-dir", str(tmp_path / "runs"), "--save-config",
                    str(device))
    assert result.returncode == 1
    assert result.stderr.endswith(f"error: --save-config {device} is a character device, not a regular file: give "
                                  "the path of a file to write (it is created, or replaced whole)\n")
    assert result.stderr.count("error:") == 1
    assert stat.S_ISCHR(device.lstat().st_mode) and device.lstat().st_rdev == FULL_DEVICE


@pytest.mark.integration
def test_report_out_with_a_fifo_in_place_of_a_file_is_refused_without_waiting(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "timing.jsonl").write_text('{"epoch": 1, "epochs": 1, "seconds": 1.0, "samples": 100, '
                                      '"samples_per_s": 100.0, "world_size": 1}\n')
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "report.md")
    result = ddpctl("report", str(run), "--out", str(out), timeout=60)
    assert result.returncode == 1
    assert result.stderr == (f"error: cannot write the report: {out / 'report.md'} is a FIFO (named pipe), not a "
                             "regular file: move it away or give another directory with --out\n")
    assert sorted(p.name for p in out.iterdir()) == ["report.md"]
