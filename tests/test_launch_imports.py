"""What `ddpctl up` imports before it reaches a host, measured where it is cheap to get wrong: paramiko comes without
invoke (launcher/transport/paramiko_loader.py), which only an ssh config's `Match exec` needs, and that still works;
pathspec comes without asyncio (launcher/transport/pathspec_loader.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import launcher

CHECKOUT = Path(launcher.__file__).resolve().parent.parent
# The modules an `up` on SSH hosts imports before its first connection.
UP_PATH = ("launcher.cli.app", "launcher.execute.up", "launcher.places.ssh.hosts", "launcher.execute.hosts.run")


def fresh_python(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(CHECKOUT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60,
                          cwd=CHECKOUT, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.integration
def test_the_launch_path_imports_paramiko_without_invoke() -> None:
    loaded = json.loads(fresh_python(
        f"import json, sys\nfor m in {UP_PATH!r}: __import__(m)\n"
        "print(json.dumps({m: m in sys.modules for m in ('paramiko', 'invoke')}))"))
    assert loaded == {"paramiko": True, "invoke": False}
    # held back only while paramiko is imported: a program of its own can still import it
    assert fresh_python("import launcher.transport.ssh, invoke; print(invoke.__name__)").strip() == "invoke"


@pytest.mark.integration
def test_a_match_exec_in_the_ssh_config_still_runs_in_a_fresh_launcher(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text("Match exec \"test -d /\"\n  User matched\nMatch exec \"false\"\n  Port 2200\n"
                      "Host box\n  HostName 10.0.0.9\n")
    resolved = fresh_python(
        "import sys\nfrom pathlib import Path\nfrom launcher.spec.hosts import parse_host\n"
        "from launcher.transport.ssh import resolve_target\n"
        f"t = resolve_target(parse_host('box'), Path({str(config)!r}))\n"
        "print(t.user, t.hostname, t.port, 'invoke' in sys.modules)")
    assert resolved.split() == ["matched", "10.0.0.9", "22", "True"]


@pytest.mark.integration
def test_the_slurm_submission_path_imports_pathspec_without_asyncio() -> None:
    loaded = json.loads(fresh_python(
        "import json, sys\nimport launcher.cli.app, launcher.places.slurm.up\n"
        "print(json.dumps({m: m in sys.modules for m in ('pathspec', 'asyncio', 'typing_extensions')}))"))
    assert loaded == {"pathspec": True, "asyncio": False, "typing_extensions": False}
    # held back only while pathspec is imported: a program of its own can still import it, pathspec works
    assert fresh_python("import launcher.transport.sync, typing_extensions\n"
                        "from launcher.transport.pathspec_loader import pathspec\n"
                        "print(typing_extensions.__name__, pathspec.GitIgnoreSpec.from_lines(['*.pyc'])"
                        ".match_file('a/b.pyc'))").split() == ["typing_extensions", "True"]
