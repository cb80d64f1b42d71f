"""Several modules of this package sent as one program (`python -c PROGRAM ARGS...`): each module's own text
(`source_of`, never a second copy) becomes a module of that name on the host, so the modules import each other
there as they do here (`from launcher.remote import proctree`), then the first one's `main(argv)` runs and its
return value is the exit status. The host needs its python only: nothing has to be written there first (what
is compiled is kept there, see _LOADER)."""

import functools
import hashlib
import zlib
from types import ModuleType

from launcher.remote import client_watch, source_of

# What the host runs after the sources: every module defined in the order given (a module after those it
# imports), under a `launcher.remote` package made for them, then the main one's main(sys.argv[1:]). Compiling
# the sources is most of a short program's CPU (a state poll: ~20 of ~45 ms, every second on every node), so a
# program made with `keep` (a node's start and its state poll: they run where ddpctl already has ~/.ddpctl)
# keeps its compiled modules on the host, ~/.ddpctl/programs/<python's cache tag>-<_KEY> (marshal, which only
# that Python version reads; _KEY is the sources' digest), as Python keeps a module's .pyc: read when it is there
# and whole, written (atomically) when not, never where ~/.ddpctl is not there yet (a probe, which writes nothing,
# is not made with `keep`), and done without when the home folder cannot be written.
_LOADER = r"""
import marshal
import os
import sys
import types


def _package(name):
    if name not in sys.modules:
        package = types.ModuleType(name)
        package.__path__ = []
        sys.modules[name] = package
        parent, _, leaf = name.rpartition(".")
        if parent:
            setattr(_package(parent), leaf, package)
    return sys.modules[name]


def _compiled():
    files = ["<ddpctl " + name + ">" for name, _ in _SOURCES]
    tag = getattr(sys.implementation, "cache_tag", None)
    home = os.path.join(os.path.expanduser("~"), ".ddpctl")
    kept = os.path.join(home, "programs", str(tag) + "-" + _KEY) if tag and _KEEP else ""
    if kept:
        try:
            with open(kept, "rb") as f:
                codes = marshal.load(f)
            if isinstance(codes, list) and [getattr(c, "co_filename", None) for c in codes] == files:
                return codes
        except (OSError, EOFError, ValueError, TypeError):
            pass
    codes = [compile(source, file, "exec") for (_, source), file in zip(_SOURCES, files)]
    if kept and os.path.isdir(home):
        part = kept + "." + str(os.getpid())
        try:
            if not os.path.isdir(os.path.dirname(kept)):
                os.mkdir(os.path.dirname(kept), 0o700)
            with open(part, "wb") as f:
                marshal.dump(codes, f)
            os.replace(part, kept)
        except OSError:
            try:
                os.unlink(part)
            except OSError:
                pass
    return codes


for (_name, _), _code in zip(_SOURCES, _compiled()):
    _module = types.ModuleType(_name)
    _module.__file__ = _code.co_filename
    sys.modules[_name] = _module
    _parent, _, _leaf = _name.rpartition(".")
    setattr(_package(_parent), _leaf, _module)
    exec(_code, _module.__dict__)
if _WATCH:
    sys.modules["launcher.remote.client_watch"].end_with_client()
sys.exit(sys.modules[_MAIN].main(sys.argv[1:]))
"""


def program(main: ModuleType, *needs: ModuleType, keep: bool = False, end_with_client: bool = False) -> str:
    """The text of `python -c` that runs `main.main(argv)` on a host, with the modules it imports (`needs`, each
    after those it imports itself) defined from their own source first; with `keep`, their compilation is kept on
    the host (see _LOADER); with `end_with_client`, the program ends when the SSH client that started it is gone
    (launcher/remote/client_watch.py: never for a program whose process must outlive it, as a node's supervisor)."""
    watch = (client_watch,) if end_with_client and client_watch not in needs else ()
    sources = [(m.__name__, source_of(m)) for m in (*watch, *needs, main)]
    key = hashlib.sha256(repr(sources).encode()).hexdigest()[:32]
    return (f"_SOURCES = {sources!r}\n_MAIN = {main.__name__!r}\n_KEY = {key!r}\n_KEEP = {keep!r}\n"
            f"_WATCH = {end_with_client!r}\n" + _LOADER)


# The command line of a program sent on standard input: read it all, decompress, run it as the main module. The
# arguments after it are the program's (sys.argv[1:]), as with the program itself after `-c`.
STDIN_LOADER = "import sys, zlib; exec(zlib.decompress(sys.stdin.buffer.read()))"


@functools.lru_cache(maxsize=8)  # each poll of each node sends the same program: compressed once, not per poll
def on_stdin(text: str) -> "tuple[list[str], bytes]":
    """`python` arguments and standard input that run the program `text` as `python -c TEXT` would:
    (["-c", STDIN_LOADER], TEXT compressed)."""
    return ["-c", STDIN_LOADER], zlib.compress(text.encode(), 9)


# The command line of a program followed by more input (a served program's requests): the compressed program's
# length on a line, then the program, whose own reads of standard input then get what follows it.
AHEAD_LOADER = "import sys, zlib; exec(zlib.decompress(sys.stdin.buffer.read(int(sys.stdin.buffer.readline()))))"


@functools.lru_cache(maxsize=8)
def ahead_of_input(text: str) -> "tuple[list[str], bytes]":
    """`python` arguments and the first bytes of standard input that run the program `text` as `python -c TEXT`
    would, with the rest of standard input left for it to read: (["-c", AHEAD_LOADER], LENGTH\\nCOMPRESSED)."""
    packed = zlib.compress(text.encode(), 9)
    return ["-c", AHEAD_LOADER], f"{len(packed)}\n".encode() + packed
