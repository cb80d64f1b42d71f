"""Runs on a node under the run's python (standard library only; sent as this file's text by
launcher/execute/hosts/mpi_access.py): one MPI run's key line in the login user's ~/.ssh/authorized_keys, added before
the
job and taken out after it. `add LINE` appends LINE (making ~/.ssh 0700 and the file 0600 when missing; exit 3 when
it cannot); `remove MARKER LINE` removes every line equal to LINE, keeping the file's mode and every other line,
and exits 4 when a line holding MARKER (the run's) is still there."""

import os
import sys

CANNOT_ADD = 3
STILL_THERE = 4


def keys_file() -> str:
    return os.path.join(os.path.expanduser("~"), ".ssh", "authorized_keys")


def add(line: str) -> int:
    """Append `line`; new folders and files are the owner's only. 0, or CANNOT_ADD saying why on stderr."""
    os.umask(0o077)
    try:
        os.makedirs(os.path.dirname(keys_file()), exist_ok=True)
        with open(keys_file(), "a", encoding="utf-8", errors="surrogateescape") as f:
            f.write(line + "\n")
    except OSError as e:
        print(f"cannot add the key to {keys_file()}: {e.strerror or e}", file=sys.stderr)
        return CANNOT_ADD
    return 0


def remove(marker: str, line: str) -> int:
    """Take every line equal to `line` out of the file (rewritten in place: its mode and owner stay); 0, or
    STILL_THERE when a line holding `marker` remains. No file: nothing to remove."""
    path = keys_file()
    if not os.path.isfile(path):
        return 0
    wanted = os.fsencode(line)
    try:
        with open(path, "r+b") as f:
            kept = [each for each in f.read().splitlines(keepends=True) if each.rstrip(b"\n") != wanted]
            f.seek(0)
            f.write(b"".join(kept))
            f.truncate()
    except OSError as e:
        print(f"cannot rewrite {path}: {e.strerror or e}", file=sys.stderr)
        return STILL_THERE
    return STILL_THERE if any(os.fsencode(marker) in each for each in kept) else 0


def main(argv: "list[str]") -> int:
    if argv[:1] == ["add"] and len(argv) == 2:
        return add(argv[1])
    if argv[:1] == ["remove"] and len(argv) == 3:
        return remove(argv[1], argv[2])
    print("usage: add LINE | remove MARKER LINE", file=sys.stderr)
    return 2


if __name__ == "__main__":  # `python -c SOURCE add LINE` / `python -c SOURCE remove MARKER LINE` on the node
    sys.exit(main(sys.argv[1:]))
