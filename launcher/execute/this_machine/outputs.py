"""A user script run locally (`ddpctl up -- CMD`, no --host) runs in the user's own directory, so what it writes
there is already where the user is: nothing is copied (snapshots can be big). What the run directory gets instead:
- `out/`, the folder DDPCTL_OUTPUT_DIR names to the script (as on hosts, where it comes back into nodes/<k>/out/);
- WORKDIR_FILE: where the script ran and which files under that directory it created or changed during the run,
  each with its size and sha256, so the run says what it wrote and a later change to those files can be seen.
Files are told apart by (size, mtime) before and after the run; the runs directory (--runs-dir), .git, .venv
and interpreter caches are not looked at."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from launcher.results.rundir import RunDir, write_json_atomic
from launcher.transport.digest import file_sha256

WORKDIR_FILE = "workdir.json"
NOT_LOOKED_AT = ("__pycache__", ".git", ".venv")
MAX_LISTED = 100_000  # files looked at; a bigger tree is recorded as not listed rather than walked for minutes


@dataclass
class LocalOutputs:
    """The state of a local script's working directory before its run, to tell what it wrote."""

    run_dir: RunDir
    workdir: Path
    before: dict[str, tuple[int, int]] | None

    @classmethod
    def start(cls, run_dir: RunDir, workdir: str) -> LocalOutputs:
        """Make the run's output folder and note the working directory's files (call before the script starts)."""
        (run_dir.path / "out").mkdir(exist_ok=True)
        root = Path(workdir).resolve()
        return cls(run_dir, root, _stat_tree(root, run_dir.path.parent.resolve()))

    def finish(self) -> None:
        """Write WORKDIR_FILE: the files created or changed since `start` (call after the script ended)."""
        after = _stat_tree(self.workdir, self.run_dir.path.parent.resolve())
        record: dict[str, object] = {"workdir": str(self.workdir), "files": None}
        if self.before is not None and after is not None:
            written = sorted(rel for rel, state in after.items() if self.before.get(rel) != state)
            record["files"] = [{"path": rel, "size": after[rel][0], "sha256": file_sha256(self.workdir / rel)}
                               for rel in written]
        else:
            record["note"] = f"more than {MAX_LISTED} files under the working directory: not listed"
        write_json_atomic(self.run_dir.path / WORKDIR_FILE, record)


def _stat_tree(root: Path, runs_path: Path) -> dict[str, tuple[int, int]] | None:
    """relative path -> (size, mtime in ns) of the regular files under root; None past MAX_LISTED files."""
    found: dict[str, tuple[int, int]] = {}
    for top, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in NOT_LOOKED_AT and Path(top, d).resolve() != runs_path
                   and not os.path.islink(os.path.join(top, d))]
        for name in files:
            full = os.path.join(top, name)
            try:
                st = os.lstat(full)
            except OSError:
                continue  # removed meanwhile
            if not os.path.isfile(full) or os.path.islink(full) or name.endswith(".pyc"):
                continue
            found[os.path.relpath(full, root)] = (st.st_size, st.st_mtime_ns)
            if len(found) > MAX_LISTED:
                return None
    return found
