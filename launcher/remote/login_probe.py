"""Runs on a Slurm login node under the run's --python (standard library only; sent as this file's text,
launcher/schedulers/slurm/cluster.py): the workdir expanded there ($SCRATCH, ~), whether it is writable, its free
space, and whether torch is installed for that interpreter (the one the nodes will run, on the same shared file
system), as one JSON object on stdout. Its one argument is the workdir as the user gave it.

It writes nothing: `up --dry-run` is read-only, and the run itself makes the workdir when it places the job's files.
Whether the workdir can be made is asked of the deepest folder on its path that exists. Variables the login node
does not set are named (`unset`): expanded, they would stay literal folder names."""

import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import sys
from typing import Any


def login_facts(workdir_arg: str) -> "dict[str, Any]":
    """home, workdir (absolute), python; unset (the variables it names that are not set); writable and free, or
    why not; torch's version, or torch_error."""
    workdir = os.path.abspath(os.path.expanduser(os.path.expandvars(workdir_arg)))
    out: dict[str, Any] = {"home": os.path.expanduser("~"), "workdir": workdir, "python": sys.executable}
    named = re.findall(r"\$(?:\{(\w+)\}|(\w+))", workdir_arg)
    unset = sorted({braced or bare for braced, bare in named} - set(os.environ))
    if unset:
        out["unset"] = unset
    out.update(_can_make(workdir))
    # Found, not imported: importing torch takes seconds on a busy login node, and the nodes import it anyway.
    if importlib.util.find_spec("torch") is None:
        out["torch_error"] = "No module named 'torch'"
    else:
        try:
            out["torch"] = importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            out["torch"] = "unknown version"
    return out


def _can_make(workdir: str) -> "dict[str, Any]":
    """writable and free (of the file system it is on), or writable False and why: asked of the workdir, or of the
    deepest folder above it that exists, where the run would make it."""
    existing = workdir
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return {"writable": False, "why": f"{existing} is not a folder"}
    if not os.access(existing, os.W_OK | os.X_OK):
        return {"writable": False, "why": f"{existing}: Permission denied"}
    if os.statvfs(existing).f_flag & os.ST_RDONLY:
        return {"writable": False, "why": f"{existing}: Read-only file system"}
    return {"writable": True, "free": shutil.disk_usage(existing).free}


if __name__ == "__main__":  # `python -c SOURCE WORKDIR` on the login node
    print(json.dumps(login_facts(sys.argv[1])))
