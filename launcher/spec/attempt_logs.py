"""torchrun, with each start of a node's workers in its own attempt folder and a note of how an attempt ended.

Run on a node as `PYTHON -c SOURCE TORCHRUN-OPTIONS...` (launcher/spec/torchrun.py), in place of
`PYTHON -m torch.distributed.run`: this file's source, standard library and torch only; ddpctl reads it as text
and never imports torch itself.

Why: torchrun names a worker group's log folder `attempt_<N>` after its own count of failures
(TORCHELASTIC_RESTART_COUNT), and empties that folder before it starts the workers. A node whose workers were
restarted because another node's worker failed counts no failure of its own, so it starts its second attempt in
`attempt_0` again and the first attempt's logs are lost. Here the folder is numbered by how many times this node
started its workers (the workers still see torch's own count), so every attempt keeps its logs and N means the
same restart on every node; each worker gets that N as DDPCTL_ATTEMPT. When an attempt's workers fail,
`attempt_<N>/ended.json` says which: {"time", "failures": [{"rank" (global), "local_rank", "exitcode" (negative:
a signal), "pid", "time", "stderr_tail" (its last lines)}]}, the first failure first (a worker torchrun stopped
with SIGTERM after it last). A torch whose internals differ runs unchanged (its own numbering, no note)."""

import contextlib
import json
import os
import runpy
import time

ENDED_FILE = "ended.json"
# Given to every worker: the attempt its node is in (this file's numbering; TORCHELASTIC_RESTART_COUNT stays torch's).
ATTEMPT_ENV = "DDPCTL_ATTEMPT"
TAIL_LINES = 40
TAIL_BYTES = 16384


def _tail(path):
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - TAIL_BYTES))
            return f.read().decode("utf-8", "replace").splitlines()[-TAIL_LINES:]
    except OSError:
        return []


def _note_ended(attempt_dir, failures):
    records = []
    for rank, failure in failures.items():
        local_rank = getattr(failure, "local_rank", None)
        records.append({"rank": rank, "local_rank": local_rank, "exitcode": getattr(failure, "exitcode", None),
                        "pid": getattr(failure, "pid", None), "time": getattr(failure, "timestamp", None),
                        "stderr_tail": _tail(os.path.join(attempt_dir, str(local_rank), "stderr.log"))})
    records.sort(key=lambda r: (r["exitcode"] == -15, r["time"] or 0))
    path = os.path.join(attempt_dir, ENDED_FILE)
    with open(path + ".tmp", "w") as f:
        json.dump({"time": time.time(), "failures": records}, f)
    os.replace(path + ".tmp", path)


def _patch_torchrun():
    from torch.distributed.elastic.agent.server import local_elastic_agent
    from torch.distributed.elastic.multiprocessing import api

    specs = getattr(api, "DefaultLogsSpecs", None)
    reify = getattr(specs, "reify", None)
    monitor = getattr(local_elastic_agent.LocalElasticAgent, "_monitor_workers", None)
    if reify is None or monitor is None:
        return
    current: dict = {"starts": 0, "dir": None, "noted": False}

    def numbered_reify(self, envs):
        attempt = current["starts"]
        current["starts"] += 1
        for env in envs.values():  # the workers' own attempt number, the same on every node (ATTEMPT_ENV)
            env[ATTEMPT_ENV] = str(attempt)
        first = envs[0] if envs else {}
        torch_count = first.get("TORCHELASTIC_RESTART_COUNT")
        first["TORCHELASTIC_RESTART_COUNT"] = str(attempt)
        try:
            destinations = reify(self, envs)
        finally:
            if torch_count is None:
                first.pop("TORCHELASTIC_RESTART_COUNT", None)
            else:
                first["TORCHELASTIC_RESTART_COUNT"] = torch_count
        run_dir = getattr(self, "_run_log_dir", None)
        current["dir"] = os.path.join(run_dir, f"attempt_{attempt}") if run_dir else None
        current["noted"] = False
        return destinations

    def noting_monitor(self, worker_group):
        result = monitor(self, worker_group)
        failures = getattr(result, "failures", None)
        if failures and current["dir"] and not current["noted"]:
            current["noted"] = True
            with contextlib.suppress(Exception):  # a note that cannot be written must not end the run
                _note_ended(current["dir"], failures)
        return result

    setattr(specs, "reify", numbered_reify)  # noqa: B010 - replaced on the class, as mypy cannot type it
    setattr(local_elastic_agent.LocalElasticAgent, "_monitor_workers", noting_monitor)  # noqa: B010


if __name__ == "__main__":  # `python -c` runs it as __main__; importing it does nothing
    with contextlib.suppress(Exception):  # a torch this does not fit: torchrun runs as torch made it
        _patch_torchrun()
    runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
