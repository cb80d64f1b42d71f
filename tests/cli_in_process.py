"""ddpctl's command line called in this process (`launcher.cli.app.main`, what `python -m launcher` runs), for the
tests of what a refused or planned command prints and writes: the exit status it would leave with (its
SystemExit's code), its stdout and stderr, in a working directory and environment of the test's choosing.

A subprocess costs ~0.7 s of CPU to import the launcher; this costs milliseconds. It is for tests where no process
boundary is what is tested: not signals, not what is left running, not the environment handed to what the
command starts (those keep `python -m launcher` in a process of its own)."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def _environment(env: dict[str, str | None]) -> Iterator[None]:
    """os.environ with `env` set (None: removed), as it was afterwards."""
    before = {key: os.environ.get(key) for key in env}
    try:
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def ddpctl_in_process(*args: str, cwd: Path | None = None,
                      env: dict[str, str | None] | None = None) -> subprocess.CompletedProcess[str]:
    """`ddpctl ARGS` as main() runs it: returncode, stdout and stderr as a subprocess's would be."""
    from launcher.cli.app import main

    out, err = io.StringIO(), io.StringIO()
    code: int = 0
    with contextlib.ExitStack() as stack:
        if cwd is not None:
            stack.enter_context(contextlib.chdir(cwd))
        stack.enter_context(_environment(env or {}))
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        try:
            main(list(args))
        except SystemExit as exit_:  # exit_with(): sys.exit(status)
            status = exit_.code
            code = status if isinstance(status, int) else (0 if status is None else 1)
    return subprocess.CompletedProcess(["ddpctl", *args], code, out.getvalue(), err.getvalue())
