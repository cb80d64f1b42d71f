"""The bad-input table (issue 12): every input a user can get wrong, given to the real CLI, is refused with one
line saying what was wrong and what to do (runs on hosts: one line per failing host under a header line), a
non-zero exit, nothing written (no run directory, no file under the temporary home, working directory or
--runs-dir, no workspace on a host) and no process left behind (here or on a host).

Rows that need hosts share the session's two-host test bed, lent to the module: host 0 as it comes, host 1 with no
SFTP subsystem.
tests/test_local_up.py keeps its own table of option values; the rows here are the cases issue 12 found unclear
and a sample of every other family (config files, `-- CMD`, providers, reattach, SSH trust and keys).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from infra.testbed import Testbed, user_pids
from launcher.spec.trainer_bounds import SEED_MAX, TRAINER_BOUNDS
from tests.testbed_fixtures import REPO, lent

# A row's argv may name: {h0} (a working host), {nosftp} (a host whose sshd has no SFTP), {key} (the bed's client
# key), {pub} ({key}.pub), {enc} (a passphrase-protected key), {tmp} (the row's own directory).
# The CPU process limit applies where no GPU is visible: a GPU machine hides its GPUs for those rows.
NO_GPU = {"CUDA_VISIBLE_DEVICES": "", "DDPCTL_MAX_CPU_PROCESSES": ""}


@dataclass(frozen=True)
class Row:
    """One bad input: the command line, the words its one line must hold, and what it needs."""

    argv: tuple[str, ...]
    words: tuple[str, ...]
    bed: bool = False  # needs the test bed's hosts
    env: dict[str, str] = field(default_factory=dict)
    ssh_config: str = ""  # the user's ~/.ssh/config for the row (placeholders as in argv)
    trust_bed: bool = True  # DDPCTL_KNOWN_HOSTS holds the bed's host keys (False: an empty file)


def up(*args: str, **kw: object) -> Row:
    return Row(("up", "--runs-dir", "{tmp}/runs", *args), **kw)  # type: ignore[arg-type]


def on_host(*args: str, host: str = "{h0}", key: str = "{key}", **kw: object) -> Row:
    return up("--host", host, "-i", key, *args, bed=True, **kw)


ROWS = {
    # -- issue 12: trainer values, checked by the launcher before anything is written -----------------------
    "synthetic-train-size-0": up("--synthetic-train-size", "0", words=("--synthetic-train-size", ">= 1", "got 0")),
    "synthetic-test-size-negative": up("--synthetic-test-size", "-5", words=("--synthetic-test-size", "got -5")),
    "seed-above-32-bits": up("--seed", str(SEED_MAX + 1), words=("--seed", f"0..{SEED_MAX}")),
    "seed-negative": up("--seed", "-1", words=("--seed", "got -1")),
    "save-every-0": up("--save-every", "0", words=("--save-every", ">= 1")),
    "batch-size-0": up("--batch-size", "0", words=("--batch-size", ">= 1")),
    "lr-0": up("--lr", "0", words=("--lr", "positive")),
    "lr-nan": up("--lr", "nan", words=("--lr", "finite")),
    "threads-0": up("--threads-per-process", "0", words=("--threads-per-process", ">= 1")),
    "keep-snapshots-0": up("--trainer-arg", "--keep-snapshots=0", words=("--keep-snapshots", ">= 1")),
    "momentum-negative": up("--trainer-arg", "--momentum", "--trainer-arg", "-1", words=("--momentum", ">= 0")),
    "average-every-0": up("--strategy", "local-sgd", "--average-every", "0", words=("--average-every", "'epoch'")),
    "devices-for-ddp": up("--devices", "cpu", words=("--devices", "dp, mp or ddp-mp")),
    "on-hosts-synthetic-0": on_host("--synthetic-train-size", "0", words=("--synthetic-train-size", "got 0")),
    # -- issue 12: more processes than this machine runs; IPv6 without brackets ------------------------------
    "local-gpus-64": up("--gpus", "64", env=NO_GPU,
                        words=("--gpus 64", "no GPU", "CPU cores", "at most", "DDPCTL_MAX_CPU_PROCESSES")),
    "local-gpus-above-override": up("--gpus", "5", env={**NO_GPU, "DDPCTL_MAX_CPU_PROCESSES": "4"},
                                    words=("--gpus 5", "DDPCTL_MAX_CPU_PROCESSES allows 4", "--gpus 4 or less")),
    "cpu-limit-not-a-number": up("--gpus", "2", env={**NO_GPU, "DDPCTL_MAX_CPU_PROCESSES": "lots"},
                                 words=("DDPCTL_MAX_CPU_PROCESSES", "'lots'", "whole number")),
    "ipv6-bare-with-port": up("--host", "2001:db8::1:22", words=("IPv6", "brackets", "[2001:db8::1]:22")),
    "ipv6-bare-user": up("--host", "root@fd00::2", words=("IPv6", "root@[fd00::2]")),
    # -- issue 12: keys and SSH servers --------------------------------------------------------------------
    "public-key-as-identity": on_host(key="{pub}", words=("{pub}", "public half", "--identity-file {key}")),
    "passphrase-key-no-agent": on_host(key="{enc}", words=("{enc}", "passphrase", "ssh-add {enc}")),
    "host-without-sftp": on_host(host="{nosftp}", words=("{nosftp}", "SFTP", "Subsystem sftp")),
    "proxycommand-fails": on_host(host="viaproxy", ssh_config="Host viaproxy\n  HostName 192.0.2.1\n"
                                  "  ProxyCommand no-such-proxy-program %h %p\n",
                                  words=("viaproxy", "ProxyCommand `no-such-proxy-program 192.0.2.1 22`", "exited")),
    "proxycommand-unknown-token": on_host(host="viatoken", ssh_config="Host viatoken\n  ProxyCommand nc %z\n",
                                          words=("ProxyCommand", "%z", "%h, %p")),
    # -- already handled: SSH trust, keys and reachability ---------------------------------------------------
    "unknown-host-key": on_host(trust_bed=False, words=("{h0}", "unknown host key", "--accept-new-host-keys")),
    "missing-key-file": on_host(key="{tmp}/nope", words=("{h0}", "{tmp}/nope (not found)")),
    "nothing-listening": on_host(host="{h0addr}:2", words=("connection refused", "sshd running")),
    "more-gpus-than-host-cores": on_host("--gpus", "64", words=("{h0}", "--gpus 64 but the host has")),
    # -- already handled: host and option forms --------------------------------------------------------------
    "host-twice": up("--host", "a", "--host", "a", words=("--host 'a' is given twice",)),
    "host-option-injection": up("--host", "-oProxyCommand=x", words=("is not of the form",)),
    "model-unknown": up("--model", "vgg", words=("unknown model 'vgg'",)),
    "strategy-unknown": up("--strategy", "pipeline", words=("unknown strategy 'pipeline'", "ddp")),
    "env-bad-name": up("--env", "1BAD=x", words=("'1BAD'", "not valid")),
    "vast-option-locally": up("--max-price", "0.4", words=("--max-price", "--provider vast")),
    "vast-without-image": up("--provider", "vast", words=("--provider vast needs --image",)),
    "docker-locally": up("--runtime", "docker", words=("--runtime docker needs --host",)),
    # -- already handled: config files and `-- CMD` ----------------------------------------------------------
    "config-missing": up("--config", "{tmp}/none.toml", words=("--config", "no such file")),
    "command-is-torchrun": up("--", "torchrun", "train.py", words=("torchrun", "--gpus")),
    "command-with-trainer-option": up("--synthetic-train-size", "64", "--", "python3", "train.py",
                                      words=("--synthetic-train-size",)),
    "strategy-with-command": up("--strategy", "spawn", "--", "python3", "x.py", words=("drop --strategy spawn",)),
    # -- already handled: other commands ---------------------------------------------------------------------
    "status-not-a-run": Row(("status", "{tmp}/nothing"), words=("not a ddpctl run directory",)),
    "report-not-a-directory": Row(("report", "{tmp}/nothing"), words=("not a directory",)),
    "sweep-gpus-0": Row(("sweep", "--runs-dir", "{tmp}/runs", "--gpus", "0"), words=("--gpus", "positive integer")),
    "sweep-gpus-64": Row(("sweep", "--runs-dir", "{tmp}/runs", "--gpus", "1,64"), env=NO_GPU,
                         words=("--gpus 64", "no GPU", "at most")),
    "sweep-synthetic-0": Row(("sweep", "--runs-dir", "{tmp}/runs", "--gpus", "1", "--synthetic-train-size", "0"),
                             words=("--synthetic-train-size", "got 0")),
}  # fmt: skip


@pytest.fixture(scope="module")
def bed(two_hosts: Testbed) -> Iterator[Testbed]:
    """The pytest process's two hosts (tests/testbed_fixtures.py), lent to this module with host 1's SFTP off and
    given back as the bed made them; only rows that need hosts ask for it (it skips, saying why, where no bed can
    run)."""
    for lent_bed in lent(two_hosts):
        lent_bed.hosts[1].set_sftp(False)
        yield lent_bed


@pytest.fixture(scope="module")
def passphrase_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    key = tmp_path_factory.mktemp("keys") / "id_locked"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "correct horse", "-f", str(key)], check=True)
    return key


@pytest.mark.parametrize("name", [pytest.param(name, marks=[pytest.mark.testbed] if row.bed else [])
                                  for name, row in ROWS.items()])
def test_bad_input_is_named_in_one_line(name: str, passphrase_key: Path, tmp_path: Path,
                                        request: pytest.FixtureRequest) -> None:
    row = ROWS[name]
    bed: Testbed | None = request.getfixturevalue("bed") if row.bed else None
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    cwd.mkdir()
    (home / ".ssh").mkdir(parents=True)
    values = {"tmp": str(tmp_path), "enc": str(passphrase_key)}
    if bed is not None:
        h0, nosftp = bed.hosts
        values.update(h0=h0.spec, h0addr=f"{h0.user}@{h0.address}", nosftp=nosftp.spec, key=bed.client_key_path,
                      pub=bed.client_key_path + ".pub")
    (home / ".ssh" / "config").write_text(row.ssh_config.format(**values))
    known_hosts = bed.known_hosts_path if bed is not None and row.trust_bed else tmp_path / "known_hosts"
    marker = uuid.uuid4().hex
    env = {key: value for key, value in os.environ.items() if key != "SSH_AUTH_SOCK"}  # no ssh-agent
    env.update(HOME=str(home), PYTHONPATH=str(REPO), DDPCTL_KNOWN_HOSTS=str(known_hosts), DDPCTL_BAD_INPUT=marker,
               **row.env)
    before = files_under(tmp_path)
    result = subprocess.run([sys.executable, "-m", "launcher", *(word.format(**values) for word in row.argv)],
                            capture_output=True, text=True, cwd=cwd, env=env, timeout=120)

    print(f"$ ddpctl {' '.join(result.args[3:])}\n{result.stderr}")  # shown with pytest -rP
    assert result.returncode != 0, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines and lines[0].startswith("error: "), result.stderr
    if len(lines) > 1:  # hosts: a header, then one line per failing host (or per problem found on it)
        assert lines[0].endswith(":") and all(line.startswith("  ") for line in lines[1:]), result.stderr
    words = [word.format(**values) for word in row.words]
    assert any(all(word in line for word in words) for line in lines), f"{words} not in one line of:\n{result.stderr}"
    assert "Traceback" not in result.stderr
    assert files_under(tmp_path) == before, "the refused command wrote files"
    assert not processes_with(marker), "the refused command left processes running"
    if bed is not None:
        for host in bed.hosts:
            assert not Path(host.home, ".ddpctl").exists(), f"a workspace was made on {host.spec}"
            assert not host_processes_left(host.user), f"processes left on {host.spec}"


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def processes_with(marker: str) -> list[int]:
    """Processes whose environment holds the row's marker (every process the command started inherits it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def host_processes_left(user: str, wait: float = 5.0) -> list[int]:
    """The host user's processes other than sshd's own (which leave as the connection closes), after `wait`."""
    deadline = time.monotonic() + wait
    while True:
        left = []
        for pid in user_pids(user):
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
            except OSError:
                continue
            if not command.startswith(b"sshd"):
                left.append(pid)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


@pytest.mark.parametrize("option", sorted(TRAINER_BOUNDS))
def test_the_launchers_bounds_are_the_trainers(option: str) -> None:
    """Each bound in launcher/spec/trainer_bounds.py: the trainer's own parser accepts the value at the bound and
    refuses the one just past it, so the launcher refuses exactly what the trainer would."""
    pytest.importorskip("torch", reason="the trainer's parser imports torch")
    from trainer.__main__ import parse_command_line

    bound = TRAINER_BOUNDS[option]
    extra = {"--processes": ["--strategy", "spawn"]}.get(option, [])
    if bound.kind is int:
        values: list[tuple[float, bool]] = [(bound.low, True), (bound.low - 1, False)]
    else:  # floats: the smallest value past an open bound, or just below a closed one
        values = [(bound.low, False), (bound.low + 1e-9, True)] if bound.open_low else [(bound.low, True),
                                                                                        (bound.low - 1e-9, False)]
        if option != "--momentum":  # the trainer lets an infinite momentum through; the launcher does not
            values.append((float("inf"), False))
    if bound.high is not None:
        values += [(bound.high, True), (bound.high + 1, False)]
    for number, valid in values:
        value = int(number) if bound.kind is int else float(number)
        text = str(value)
        assert bound.accepts(value) == valid, (option, text)
        if valid:
            parse_command_line([option, text, *extra])
        else:
            with pytest.raises(SystemExit):
                parse_command_line([option, text, *extra])
