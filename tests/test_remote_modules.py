"""Code that runs on the hosts is modules of launcher/remote/: standard library only, and the scripts sent to the
hosts carry the module's own text (no second copy); the daemon helper is tried here, without SSH."""

from __future__ import annotations

import ast
import subprocess
import sys
import time
from pathlib import Path

import pytest

import launcher.remote
from launcher.planning.rdzv_reservation import RELEASE_SCRIPT, RESERVE_SCRIPT
from launcher.providers.vast.autostop import WATCHDOG
from launcher.remote import daemon, source_of

REMOTE = Path(launcher.remote.__file__).parent


def test_remote_modules_need_only_the_standard_library() -> None:
    """Sent as source to a host that has only its python: no launcher or third-party import, and no
    `from __future__` (it must open a file, and the source is sent ahead of a script)."""
    for path in sorted(REMOTE.glob("*.py")):
        if path.name == "__init__.py":
            continue  # the launcher's side: reads the modules' text
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert name.split(".")[0] in sys.stdlib_module_names and name != "__future__", (path.name, name)


def test_every_script_that_detaches_runs_the_daemon_modules_text() -> None:
    """One helper instead of a copy per script: each script starts with the module's source and forks nowhere
    else, so changing the module changes what the hosts run."""
    helper = source_of(daemon)
    for script in (RESERVE_SCRIPT, RELEASE_SCRIPT, WATCHDOG):
        assert script.startswith(helper)
        assert script.count("os.fork()") == helper.count("os.fork()") == 1
        assert script.count("detach(") == 2  # its definition, then the script's one call


@pytest.mark.integration
def test_detach_answers_then_goes_on_in_a_session_of_its_own(tmp_path: Path) -> None:
    """The parent's line comes back and the command ends while the child still works (its streams are not the
    caller's pipe); the child has left the caller's session and finishes what it was doing."""
    done = tmp_path / "child.txt"
    script = source_of(daemon) + (
        "import time\n"
        f"detach('started')\n"
        "time.sleep(2)\n"
        f"open({str(done) + '.tmp'!r}, 'w').write('%d %d' % (os.getsid(0), os.getpid()))\n"
        f"os.replace({str(done) + '.tmp'!r}, {str(done)!r})\n")
    began = time.monotonic()
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and result.stdout == "started\n" and result.stderr == ""
    assert time.monotonic() - began < 2  # the pipe closed before the child's work was done
    deadline = time.monotonic() + 20
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    sid, pid = (int(word) for word in done.read_text().split())
    assert sid == pid  # the session leader of a session of its own
