"""The `sitecustomize` a `-- CMD` run's nodes get (copied as HOOK_DIR/sitecustomize.py, HOOK_DIR first on their
PYTHONPATH): every Python process of the run that joins a torch.distributed process group or an MPI world writes
one record of it — kind, rank, world size, pid, node, host, attempt — as a JSON file into $DDPCTL_JOIN_DIR. The
processes a script starts itself (`mp.spawn`: a fresh interpreter inherits the environment) record theirs too. So
the world size a summary shows is what ran (launcher/results/joined_worlds.py reads them), never what was planned.

Each rank also registers for stack dumps (`ddpctl stacks`, and a stalled run's stop): faulthandler writes every
thread's Python stack to logs/stacks/rank-R.txt (beside logs/joined/) when the rank gets STACK_SIGNAL, and
rank-R.json says which process that is (pid, start time, signal), so only a process that registered is ever sent
the signal (its default action would end it). A torchrun worker registers at start (RANK is set: a rank stuck
before init_process_group is seen too), any other process when it joins a process group (mp.spawn). The trainer
does the same (trainer/stack_dumps.py); launcher/remote/rank_stacks.py takes the dumps.

Standard library only, importable without torch; it patches nothing until torch or mpi4py is imported, and then
only wraps `init_process_group` (after it returns) or reads MPI's COMM_WORLD once MPI is initialised. Any error in
it is swallowed: measuring must never break the user's script. Another sitecustomize on the path still runs.
"""

import contextlib
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import time
import types

JOIN_DIR_ENV = "DDPCTL_JOIN_DIR"
# Which process registered the dumps of its rank at start: its children (DataLoader workers started as fresh
# interpreters) inherit RANK but must not take their parent's registration.
STACKS_OWNER_ENV = "DDPCTL_STACKS_PID"
STACK_SIGNAL_OFFSET = 5  # SIGRTMIN + 5: a real-time signal that neither torch nor a training script uses
_stack_files: dict = {}  # pid -> the open dump file (faulthandler writes to its descriptor until the process ends)
_TORCH = "torch.distributed.distributed_c10d"
_MPI = "mpi4py.MPI"


def _record(kind, rank, world_size, where=None):
    folder = os.environ.get(JOIN_DIR_ENV)
    if not folder:
        return
    try:
        os.makedirs(folder, exist_ok=True)
        record = {"kind": kind, "rank": int(rank), "world_size": int(world_size), "pid": os.getpid(),
                  "node": os.environ.get("DDPCTL_NODE_RANK"), "host": os.uname().nodename,
                  # DDPCTL_ATTEMPT: the same number on every node (launcher/spec/attempt_logs.py); torch's own
                  # count stays 0 on a node restarted for another node's failure
                  "attempt": int(os.environ.get("DDPCTL_ATTEMPT") or os.environ.get("TORCHELASTIC_RESTART_COUNT")
                                 or 0),
                  "where": where, "time": time.time()}
        name = f"{kind}-{os.getpid()}-{time.monotonic_ns()}.json"
        with open(os.path.join(folder, f".{name}.tmp"), "w") as f:
            json.dump(record, f)
        os.replace(os.path.join(folder, f".{name}.tmp"), os.path.join(folder, name))
    except Exception:  # noqa: BLE001, S110 - measuring must never break the script
        pass


def _proc_start_time():
    try:
        with open("/proc/self/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _register_stacks(rank, world_size):
    """Dump this process's stacks into <logs>/stacks/rank-R.txt on STACK_SIGNAL; record who registered."""
    folder = os.environ.get(JOIN_DIR_ENV)
    if not folder or os.getpid() in _stack_files:
        return
    try:
        import faulthandler
        import signal

        stacks = os.path.join(os.path.dirname(os.path.normpath(folder)), "stacks")
        os.makedirs(stacks, exist_ok=True)
        number = int(signal.SIGRTMIN) + STACK_SIGNAL_OFFSET
        dump = open(os.path.join(stacks, f"rank-{int(rank)}.txt"), "a")  # noqa: SIM115 - open for the process
        faulthandler.register(number, file=dump, all_threads=True)
        _stack_files[os.getpid()] = dump
        record = {"rank": int(rank), "world_size": int(world_size), "pid": os.getpid(),
                  "start": _proc_start_time(), "signal": number, "dump": f"rank-{int(rank)}.txt",
                  "time": time.time()}
        part = os.path.join(stacks, f".rank-{int(rank)}.json.{os.getpid()}")
        with open(part, "w") as f:
            json.dump(record, f)
        os.replace(part, os.path.join(stacks, f"rank-{int(rank)}.json"))
        import threading

        threading.Thread(target=_dump_flight_records, args=(stacks, int(rank)), name="ddpctl-flight-record",
                         daemon=True).start()
    except Exception:  # noqa: BLE001, S110 - the dumps must never break the script
        pass


def _dump_flight_records(stacks, rank):
    """A thread: whenever <stacks>/fr-request is touched (launcher/remote/flight_records.py), write this rank's
    flight record (its process group's last collectives) to fr-rank-R.pkl. A thread, because the main thread may
    be waiting inside the very collective that the record is asked about."""
    request = os.path.join(stacks, "fr-request")
    seen = _mtime(request)
    while True:
        time.sleep(0.5)
        asked = _mtime(request)
        if asked <= seen:
            continue
        seen = asked
        dist = sys.modules.get("torch.distributed")
        try:
            if dist is None or not dist.is_initialized():
                continue
            from torch._C._distributed_c10d import _dump_fr_trace  # type: ignore[attr-defined]

            part = os.path.join(stacks, f".fr-rank-{rank}.pkl.{os.getpid()}.tmp")
            with open(part, "wb") as f:
                f.write(_dump_fr_trace())
            os.replace(part, os.path.join(stacks, f"fr-rank-{rank}.pkl"))
        except Exception:  # noqa: BLE001, S110 - a torch without a flight recorder: the stacks are still taken
            pass


def _mtime(path):
    try:
        return os.path.getmtime(path)
    except OSError:
        return 0.0


def _register_at_start():
    """A torchrun worker (RANK and WORLD_SIZE set, not inherited from a registered parent) registers now, and
    switches on torch's NCCL flight recorder (read when an NCCL process group is made; nothing on CPUs): the last
    collectives of each rank, dumped beside the stacks when a collective times out."""
    rank, world, owner = os.environ.get("RANK"), os.environ.get("WORLD_SIZE"), os.environ.get(STACKS_OWNER_ENV)
    if rank is None or world is None or (owner and owner != str(os.getpid())):
        return
    stacks = os.path.join(os.path.dirname(os.path.normpath(os.environ[JOIN_DIR_ENV])), "stacks")
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")  # gloo's and NCCL's (TORCH_NCCL_TRACE_* before 2.8)
    os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    os.environ.setdefault("TORCH_FR_DUMP_TEMP_FILE", os.path.join(stacks, "fr-trace-rank-"))
    with contextlib.suppress(ValueError):
        _register_stacks(int(rank), int(world))
        os.environ[STACKS_OWNER_ENV] = str(os.getpid())


def _torch_where(args, kwargs):
    init = kwargs.get("init_method") or (args[1] if len(args) > 1 else None)
    if isinstance(init, str) and init != "env://":
        return init
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    return f"{addr}:{port}" if addr else None


def _patch_torch(module):
    original = getattr(module, "init_process_group", None)
    if original is None or getattr(original, "_ddpctl_joins", False):
        return

    def init_process_group(*args, **kwargs):
        result = original(*args, **kwargs)
        with contextlib.suppress(Exception):
            _record("torch", module.get_rank(), module.get_world_size(), _torch_where(args, kwargs))
            _register_stacks(module.get_rank(), module.get_world_size())
        return result

    functools.update_wrapper(init_process_group, original)
    init_process_group.__dict__["_ddpctl_joins"] = True
    module.init_process_group = init_process_group


def _record_mpi(module):
    try:
        if module.Is_initialized() and not module.Is_finalized():
            world = module.COMM_WORLD
            _record("mpi", world.Get_rank(), world.Get_size(), module.Get_processor_name())
    except Exception:  # noqa: BLE001, S110 - measuring must never break the script
        pass


_AFTER_LOAD = {_TORCH: _patch_torch, _MPI: _record_mpi}


class _JoinFinder(importlib.abc.MetaPathFinder):
    """Finds the two modules as the other finders do, then runs our step after the module's own code."""

    def find_spec(self, name, path, target=None):
        after = _AFTER_LOAD.get(name)
        if after is None:
            return None
        spec = None
        for finder in [f for f in sys.meta_path if f is not self]:  # those after us (mpi4py adds its own)
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        load = loader.exec_module

        def exec_module(module):
            load(module)
            after(module)

        loader.exec_module = exec_module
        return spec


def _chain_next_sitecustomize():
    """Run the sitecustomize that ours hides (the one later on sys.path), as Python would have."""
    here = os.path.dirname(os.path.abspath(__file__))
    ours = sys.modules.get("sitecustomize")
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception:  # noqa: BLE001, S110 - as site.py does: a failing sitecustomize does not stop Python
        pass
    finally:
        if ours is not None:
            sys.modules["sitecustomize"] = ours


def _without_our_frames(tb):
    """A traceback chain without this file's frames (rebuilt: traceback objects are immutable)."""
    frames = []
    while tb is not None:
        if os.path.abspath(tb.tb_frame.f_code.co_filename) != _HERE:
            frames.append(tb)
        tb = tb.tb_next
    rebuilt = None
    for frame in reversed(frames):
        rebuilt = types.TracebackType(rebuilt, frame.tb_frame, frame.tb_lasti, frame.tb_lineno)
    return rebuilt


def _hide_our_frames(hook):
    """sys.excepthook that prints the script's traceback as if ddpctl's wrapper were not there."""

    def excepthook(kind, value, tb):
        try:
            seen, error = set(), value
            while error is not None and id(error) not in seen:  # the chained exceptions too
                seen.add(id(error))
                error.__traceback__ = _without_our_frames(error.__traceback__)
                error = error.__cause__ or error.__context__
            tb = value.__traceback__ if value is not None else tb
        except Exception:  # noqa: BLE001, S110 - the traceback as it was, rather than none
            pass
        hook(kind, value, tb)

    return excepthook


_HERE = os.path.abspath(__file__)
if os.environ.get(JOIN_DIR_ENV):
    sys.meta_path.insert(0, _JoinFinder())
    sys.excepthook = _hide_our_frames(sys.excepthook)
    _register_at_start()
_chain_next_sitecustomize()
