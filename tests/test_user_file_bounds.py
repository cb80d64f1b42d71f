"""Every file read from a path the user gave is checked for its type and size first (keys, known_hosts, ssh
config, plans, configs): a device, a FIFO, a directory or an endless file is one line, never a MemoryError, a
traceback or a wait for ever. A malformed hashed known_hosts line is ignored, as OpenSSH does; a TOML file with a
byte-order mark reads."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.cli.config import read_config
from launcher.cli.options import declared_options
from launcher.errors import DdpctlError, SpecError
from launcher.places.slurm.saved_plan import load_json
from launcher.planning.plan_file import load_plan
from launcher.spec.hosts import parse_host
from launcher.spec.user_paths import read_user_file
from launcher.transport.known_hosts import KnownHosts
from launcher.transport.paramiko_loader import paramiko
from launcher.transport.proxy_command import read_ssh_config
from launcher.transport.ssh import resolve_target
from launcher.transport.ssh_keys import KeyLoad, check_identity_file
from tests.testbed_fixtures import REPO


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


def one_line(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text, text
    return text


def test_what_is_not_a_regular_file_is_named_without_reading_it(tmp_path: Path, fifo: Path) -> None:
    for path, kind in ((Path("/dev/zero"), "a character device"), (fifo, "a FIFO (named pipe)"),
                       (tmp_path, "a directory")):
        with pytest.raises(SpecError) as caught:
            read_user_file(path, "--thing", 1024)
        assert one_line(caught.value) == (f"--thing {path} is {kind}, not a regular file: give the path of a "
                                          "regular file")


def test_a_file_larger_than_its_bound_is_refused_and_one_at_the_bound_reads(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"x" * 2049)
    with pytest.raises(SpecError, match=r"is larger than 2 KiB"):
        read_user_file(big, "--thing", 2048)
    assert read_user_file(big, "--thing", 2049) == b"x" * 2049
    # a /proc file says size 0 and is read only up to the bound
    assert len(read_user_file("/proc/self/status", "--thing", 1 << 20)) > 0
    with pytest.raises(SpecError, match="larger than"):
        read_user_file("/proc/self/status", "--thing", 16)
    with pytest.raises(FileNotFoundError):
        read_user_file(tmp_path / "missing", "--thing", 16)


@pytest.mark.parametrize("path", [Path("/dev/zero"), Path("/dev/urandom")])
def test_a_known_hosts_file_that_never_ends_is_one_line(path: Path) -> None:
    with pytest.raises(SpecError) as caught:
        KnownHosts(ddpctl_file=path, system_file=Path("/nonexistent/known_hosts")).lookup("host")
    assert one_line(caught.value).startswith(f"the known_hosts file {path} is a character device")


def _hashed(name: str) -> str:
    return str(paramiko.HostKeys.hash_host(name))


@pytest.mark.parametrize("bad", ["|1|!!!notbase64|abc=", "|1|onlysalt", "|1|c2FsdA==|aGFzaA==", "|1||",
                                 "|1|" + base64.b64encode(b"s" * 20).decode() + "|%%%", "|2|a|b"])
def test_a_malformed_hashed_line_is_ignored_and_the_next_one_still_pins(tmp_path: Path, bad: str) -> None:
    key = paramiko.Ed25519Key.from_private_key_file(str(_key(tmp_path)))
    known = tmp_path / "known_hosts"
    known.write_text(f"{bad} ssh-ed25519 {key.get_base64()}\n"
                     f"{_hashed('[h.example]:2222')} ssh-ed25519 {key.get_base64()}\n")
    found = KnownHosts(ddpctl_file=known, system_file=tmp_path / "none").lookup("[h.example]:2222")
    assert [(k.line, k.holds(key)) for k in found] == [(2, True)]
    assert KnownHosts(ddpctl_file=known, system_file=tmp_path / "none").lookup("other") == []


def _key(tmp_path: Path) -> Path:
    path = tmp_path / "id_ed25519"
    if not path.exists():
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        path.write_bytes(Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()))
    return path


def test_an_identity_file_that_is_a_device_fifo_or_huge_is_one_line(tmp_path: Path, fifo: Path) -> None:
    huge = tmp_path / "huge_key"
    huge.write_bytes(b"-" * (2 << 20))
    for path in (Path("/dev/zero"), fifo, huge):
        with pytest.raises(SpecError) as caught:
            check_identity_file(path)
        assert one_line(caught.value).startswith(f"--identity-file {path} is ")
    with pytest.raises(SpecError):
        resolve_target(parse_host("u@h.example"), tmp_path / "no_config", Path("/dev/zero"))
    check_identity_file(_key(tmp_path))  # a real key passes


def test_identity_files_from_the_ssh_config_that_cannot_be_keys_are_listed_not_read(tmp_path: Path) -> None:
    loaded = KeyLoad()
    keys = list(loaded.files(["/dev/zero", str(_key(tmp_path))], explicit=False))
    assert [path for path, _ in keys] == [str(_key(tmp_path))]
    assert loaded.tried == ["/dev/zero (the identity file /dev/zero is a character device, not a regular file)"]
    with pytest.raises(SpecError):
        list(KeyLoad().files(["/dev/zero"], explicit=True))


def test_an_ssh_config_that_is_not_a_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"^the ssh config /dev/zero is a character device"):
        read_ssh_config(Path("/dev/zero"))
    with pytest.raises(SpecError, match=r"is a directory"):
        resolve_target(parse_host("h.example"), tmp_path)
    assert read_ssh_config(tmp_path / "missing").lookup("h.example") == {"hostname": "h.example"}
    config = tmp_path / "config"
    config.write_text("Host h.example\n  Port 2200\n")
    assert resolve_target(parse_host("h.example"), config).port == 2200


def test_a_plan_that_is_a_device_or_a_directory_is_one_line(tmp_path: Path, fifo: Path) -> None:
    for path in (Path("/dev/zero"), fifo, tmp_path):
        with pytest.raises(DdpctlError) as caught:
            load_plan(path)
        assert one_line(caught.value).startswith(f"--plan {path} is ")
        assert load_json(path) is None


def test_a_config_with_a_byte_order_mark_reads_and_a_device_is_one_line(tmp_path: Path) -> None:
    from launcher.cli.app import up

    declared = declared_options(up)
    config = tmp_path / "run.toml"
    config.write_bytes("\ufeffepochs = 2\n".encode())
    assert read_config(config, declared) == {"epochs": 2}
    with pytest.raises(SpecError) as caught:
        read_config(Path("/dev/zero"), declared)
    assert one_line(caught.value) == "--config /dev/zero is a character device, not a regular file: give a TOML file"


@pytest.mark.integration
@pytest.mark.parametrize("args", [["-i", "/dev/zero", "--host", "u@h.example", "--dry-run"], ["--plan", "/dev/zero"],
                                  ["--config", "/dev/urandom"], ["--host", "h.example", "--dry-run"]])
def test_up_given_a_device_ends_in_one_line(tmp_path: Path, args: list[str]) -> None:
    """The last case: ~/.ssh/config is a link to /dev/zero."""
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").symlink_to("/dev/zero")
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(tmp_path)}
    result = subprocess.run([sys.executable, "-m", "launcher", "up", "--runs-dir", str(tmp_path / "runs"), *args],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and "is a character device, not a regular file" in line, line
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("port", ["99999", "0", "-1", "22x"])
def test_an_ssh_config_port_that_is_no_port_is_named(tmp_path: Path, port: str) -> None:
    config = tmp_path / "config"
    config.write_text(f"Host h.example\n  Port {port}\n")
    with pytest.raises(DdpctlError) as caught:
        resolve_target(parse_host("h.example"), config)
    assert one_line(caught.value) == (f"cannot read ssh config {config}: Port {port} for 'h.example' is not a port "
                                      "number (1 to 65535)")
