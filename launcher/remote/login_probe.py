"""Runs on a Slurm login node under the run's --python (standard library only; sent as this file's text,
launcher/schedulers/slurm/cluster.py): the workdir expanded there ($SCRATCH, ~), whether it is writable, its free
space, and whether torch is installed for that interpreter (the one the nodes will run, on the same shared file
system), as one JSON object on stdout. Its one argument is the workdir as the user gave it."""

import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from typing import Any


def login_facts(workdir_arg: str) -> "dict[str, Any]":
    """home, workdir (absolute), python; writable and free, or why not; torch's version, or torch_error."""
    workdir = os.path.abspath(os.path.expanduser(os.path.expandvars(workdir_arg)))
    out: dict[str, Any] = {"home": os.path.expanduser("~"), "workdir": workdir, "python": sys.executable}
    try:
        os.makedirs(workdir, exist_ok=True)
        tempfile.TemporaryFile(dir=workdir).close()
        out["writable"] = True
        out["free"] = shutil.disk_usage(workdir).free
    except OSError as e:
        out["writable"] = False
        out["why"] = e.strerror or str(e)
    # Found, not imported: importing torch takes seconds on a busy login node, and the nodes import it anyway.
    if importlib.util.find_spec("torch") is None:
        out["torch_error"] = "No module named 'torch'"
    else:
        try:
            out["torch"] = importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            out["torch"] = "unknown version"
    return out


if __name__ == "__main__":  # `python -c SOURCE WORKDIR` on the login node
    print(json.dumps(login_facts(sys.argv[1])))
