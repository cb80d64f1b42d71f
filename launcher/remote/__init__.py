"""Code that runs on the hosts, kept as modules: standard library only, no `from __future__` (a module's source is
sent ahead of the script that uses it, `python -c SOURCE+SCRIPT`), so it is linted, type-checked and unit-tested
here like any module, and what the hosts run is this file's text (`source_of`), never a second copy."""

from pathlib import Path
from types import ModuleType


def source_of(module: ModuleType) -> str:
    """The text of a module of this package, as it is sent to the hosts."""
    return Path(str(module.__file__)).read_text(encoding="utf-8")
