"""Runs on a Slurm login node under the run's --python (standard library only; sent as this file's text,
launcher/places/slurm/cluster.py): the workdir expanded there ($SCRATCH, ~), whether it is writable, its free
space, and whether torch is installed for that interpreter (the one the nodes will run, on the same shared file
system), as one JSON object on stdout. Its arguments: the workdir as the user gave it, then (optional) the code
cache to list, relative to the workdir (`code/<key>`): its tree_sync manifest comes back as `manifest`, so that
shipping the code needs no round trip of its own to compare. Sent with tree_sync as one program
(launcher/remote/program.py).

It writes nothing: `up --dry-run` is read-only, and the run itself makes the workdir when it places the job's files.
Whether the workdir can be made is asked of the deepest folder on its path that exists. Variables the login node
does not set are named (`unset`): expanded, they would stay literal folder names."""

import importlib.util
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Iterable
from typing import Any

LIST_SECONDS = 20  # past this the cache is not listed here; shipping lists it itself


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
    found = importlib.util.find_spec("torch")
    if found is None:
        out["torch_error"] = "No module named 'torch'"
    else:
        out["torch"] = _torch_version(found.submodule_search_locations)
    return out


def _torch_version(folders: "Iterable[str] | None") -> str:
    """torch's version as its own torch/version.py states it (`__version__ = '2.13.0+cpu'`, the string its
    metadata holds too); its metadata only where that file does not say it: importing importlib.metadata and
    scanning the path for distributions costs more than the rest of this probe, on the way to every submission."""
    for folder in folders or ():
        try:
            with open(os.path.join(folder, "version.py"), encoding="utf-8") as source:
                stated = re.search(r"""^__version__\s*(?::\s*str\s*)?=\s*['"]([^'"]+)['"]""", source.read(), re.M)
        except OSError:
            continue
        if stated:
            return stated.group(1)
    import importlib.metadata

    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "unknown version"


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


def cache_listing(workdir: str, cache: str) -> "dict[str, Any]":
    """tree_sync's manifest of workdir/cache, or {"error": why} where it cannot be made (shipping lists it again)."""
    from launcher.remote import tree_sync  # sent beside this module (program.py); here, the package's own

    if cache.startswith("/") or ".." in cache.split("/"):
        return {"error": f"not a path inside the workdir: {cache!r}"}
    try:
        return tree_sync.manifest(os.path.join(workdir, cache), time.monotonic() + LIST_SECONDS)
    except SystemExit as refused:  # not a folder: shipping lists it again and says so
        return {"error": str(refused)}
    except (OSError, ValueError) as e:
        return {"error": str(e)}


def main(argv: "list[str]") -> int:
    """`python -c PROGRAM WORKDIR [CACHE]` on the login node: the facts as one JSON object."""
    facts = login_facts(argv[0])
    if len(argv) > 1 and facts.get("writable"):
        facts["manifest"] = cache_listing(str(facts["workdir"]), argv[1])
    print(json.dumps(facts))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
