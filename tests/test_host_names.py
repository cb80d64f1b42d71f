"""Every host a user names (`--host [user@]host[:port]`) is checked in one place (spec/hosts.host_name_problem):
RFC 1123 labels (with `_`, as ssh config aliases use it), IPv4 dotted quads, bracketed IPv6; what is none of these
is one line naming the fault, also in a dry run without probing, never a resolver's codec error later."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.errors import SpecError
from launcher.spec.hosts import host_name_problem, parse_host
from tests.cli_in_process import ddpctl_in_process


@pytest.mark.parametrize(("text", "named"), [
    ("..@..", "empty part between dots"),
    ("u@a..b", "empty part between dots"),
    (".hidden", "empty part between dots"),
    ("u@10.0.0.300", "not an IPv4 address"),
    ("1.2.3:22", "not an IPv4 address"),
    ("4294967295", "not an IPv4 address"),
    ("x-.example.com", "starts or ends with '-'"),
    ("a." + "b" * 64 + ".com", "longer than 63 characters"),
    (".".join(["abcdefghi"] * 26), "more than DNS allows (253)"),
    ("[fe80::zz]", "not of the form"),
])
def test_a_host_that_is_no_name_or_address_is_one_line(text: str, named: str) -> None:
    with pytest.raises(SpecError) as refused:
        parse_host(text)
    line = str(refused.value)
    assert line.startswith(f"--host {text!r}") and named in line and "\n" not in line


@pytest.mark.parametrize("text", ["gpu_box", "u@node-1.cluster.internal", "host.", "10.0.0.2:2222", "u@[::1]:22",
                                  "[2001:db8::1]", "a" * 63, "xn--bcher-kva.example", "h1"])
def test_names_and_addresses_pass(text: str) -> None:
    assert parse_host(text).text == text


def test_the_check_is_the_same_for_every_name() -> None:
    assert host_name_problem("..") == ".. has an empty part between dots"
    assert host_name_problem("[::1]") is None and host_name_problem("[::g]") == "[::g] is not an IPv6 address"
    assert host_name_problem("255.255.255.255") is None


def test_a_dry_run_without_probing_refuses_it_too(tmp_path: Path) -> None:
    result = ddpctl_in_process("up", "--host", "..@..", "--host", "u@10.0.0.2", "--dry-run", "--no-probe",
                               "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert result.returncode != 0
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: --host '..@..': .. has an empty part between dots"), line
    assert "idna" not in result.stderr and not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("given", "said"), [
    ("10.0.0.300", "error: --rdzv-addr: 10.0.0.300 is not an IPv4 address"),
    ("node..0", "error: --rdzv-addr: node..0"),
])
def test_a_rendezvous_address_is_checked_as_hosts_are(tmp_path: Path, given: str, said: str) -> None:
    result = ddpctl_in_process("up", "--dry-run", "--no-probe", "--host", "a@h1", "--host", "h2", "--rdzv-addr", given,
                               cwd=tmp_path)
    assert result.returncode == 1 and result.stderr.startswith(said), result.stderr
    assert not (tmp_path / "runs").exists()  # refused before anything was written


def test_a_rendezvous_address_that_is_one_is_planned(tmp_path: Path) -> None:
    result = ddpctl_in_process("up", "--dry-run", "--no-probe", "--host", "a@h1", "--host", "h2", "--rdzv-addr",
                               "10.0.0.3", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "--rdzv-endpoint 10.0.0.3:" in result.stdout
