"""pathspec, imported without asyncio where nothing else needs it.

pathspec (1.x, on Python before 3.13) marks its deprecated functions with typing_extensions' `deprecated`, which
imports asyncio (and with it ssl and concurrent.futures) to wrap each one: an import about as long as paramiko's,
paid by every launch that ships code, for the warnings of functions the launcher never calls. Here pathspec is
imported with typing_extensions held back (pathspec then marks them with its own wrapper, which warns the same, as
it allows). Where pathspec or typing_extensions is already imported, nothing is held back.
"""

import sys

if "pathspec" not in sys.modules and "typing_extensions" not in sys.modules:
    sys.modules["typing_extensions"] = None  # type: ignore[assignment]  # `import typing_extensions` raises meanwhile
    try:
        import pathspec
    finally:
        del sys.modules["typing_extensions"]

import pathspec as pathspec  # noqa: E402, PLC0414 - the one import of pathspec the launcher's modules use
