"""Putting the join hook (launcher/runtimes/join_hook.py) where a `-- CMD` node's Python finds it: its source is
written as HOOK_DIR/sitecustomize.py in the run's workspace (this machine's run directory, or a host's workspace
over SFTP), never imported here."""

from __future__ import annotations

from pathlib import Path

from launcher.spec.launchers import HOOK_DIR

HOOK_FILE = "sitecustomize.py"


def join_hook_source() -> bytes:
    """The hook's source, as the nodes get it."""
    return (Path(__file__).parent / "join_hook.py").read_bytes()


def write_local_hook(workspace: Path) -> Path:
    """Write the hook into `workspace`/HOOK_DIR here; return that folder (to put first on PYTHONPATH)."""
    folder = workspace / HOOK_DIR
    folder.mkdir(parents=True, exist_ok=True)
    (folder / HOOK_FILE).write_bytes(join_hook_source())
    return folder
