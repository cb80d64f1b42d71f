"""Hints where ddpctl knows more than torch's error does: a script that needs CUDA or NCCL failing on a host the
probe found without a GPU, a FileNotFoundError on a path that is in the project folder but was not shipped
(.gitignore / .ddpctlignore / ddpctl's own defaults left it out), and torch's own abort as a process exits."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# What torch (or the script) says when it needs CUDA or NCCL and there is none: the CPU build's missing bindings
# (`module 'torch._C' has no attribute '_cuda_setDevice'`), no GPU or driver, NCCL asked for (a traceback's code
# line `init_process_group(backend="nccl")`, or "Distributed package doesn't have NCCL built in").
CUDA_NEEDED = re.compile(
    r"torch\._C' has no attribute '_cuda|Torch not compiled with CUDA enabled|No CUDA GPUs are available|"
    r"no CUDA-capable device|Found no NVIDIA driver|NCCL built in|ProcessGroupNCCL|[\"']nccl[\"']|"
    r"CUDA device but torch\.cuda\.is_available\(\) is False|CUDA driver initialization failed")
# C++ std::terminate with no exception, and no Python traceback before it: torch aborted the process in its native
# code. With gloo, torch 2.13 does so as a process exits while a DistributedDataParallel model is still alive (the
# interpreter tears it down after the process group): 6 of 16 runs of the DDP tutorial's multinode.py (4 ranks on
# one CPU node, torchrun), 5 of 10 of a bare DDP loop; 0 of 10 once the model was freed before destroy_process_group.
_EXIT_ABORT = "terminate called without an active exception"
_NO_SUCH_FILE = re.compile(r"FileNotFoundError: \[Errno 2\] No such file or directory: (['\"])(?P<path>.+?)\1")


@dataclass(frozen=True)
class RunHints:
    """What a run's failure hints need: per node, the GPUs the probe found (None: not probed), and the project
    folder shipped to the nodes (None: nothing shipped, e.g. our trainer or a run on this machine)."""

    gpus: tuple[int | None, ...] = ()
    source: Path | None = None
    run_id: str = ""

    def hint(self, node: int, lines: Sequence[str], where: str) -> str | None:
        """The hint for a failure on `node` whose log lines are `lines`, or None."""
        return self.cuda_hint(node, lines, where) or self.left_out_hint(lines)

    def cuda_hint(self, node: int, lines: Sequence[str], where: str) -> str | None:
        """The script needs CUDA/NCCL and the probe found no GPU on that node."""
        gpus = self.gpus[node] if node < len(self.gpus) else None
        if gpus != 0 or not any(CUDA_NEEDED.search(line) for line in lines):
            return None
        return (f"{where} has no GPU (the probe found none) and this script needs CUDA/NCCL: on CPU hosts use the "
                "gloo backend and CPU tensors (e.g. `backend = \"nccl\" if torch.cuda.is_available() else "
                "\"gloo\"`, no .cuda()/set_device), or run on hosts with GPUs")

    def left_out_hint(self, lines: Sequence[str]) -> str | None:
        """A FileNotFoundError on a path the project folder has but shipping left out: the line that ships it."""
        if self.source is None:
            return None
        missing = [found["path"] for line in lines for found in [_NO_SUCH_FILE.search(line)] if found]
        if not missing:
            return None
        rel = self._relative(missing[-1])
        if rel is None or not (self.source / rel).exists():
            return None
        from launcher.transport.sync import ignore_spec  # (paramiko: a local run never ships, never gets here)

        spec = ignore_spec(self.source)
        parts = rel.split("/")
        for depth in range(1, len(parts) + 1):  # the outermost folder (or the file) the ignore rules left out
            candidate = "/".join(parts[:depth]) + ("/" if depth < len(parts) or (self.source / rel).is_dir() else "")
            if spec.match_file(candidate):
                return (f"{rel} is in {self.source} but was not shipped (.gitignore/.ddpctlignore or ddpctl's "
                        f"defaults left {candidate} out): a .ddpctlignore line `!{candidate}` ships it")
        return None

    def _relative(self, path: str) -> str | None:
        """`path` as the script named it, relative to its working directory (the shipped copy of the folder)."""
        marker = f"/{self.run_id}/code/" if self.run_id else None
        if path.startswith("/"):
            if marker is None or marker not in path:
                return None
            path = path.split(marker, 1)[1]
        parts = [p for p in path.split("/") if p not in ("", ".")]
        return "/".join(parts) if parts and ".." not in parts else None


def run_hints(run_path: Path, record: dict[str, Any]) -> RunHints:
    """RunHints from a run directory: run.json's node_facts (GPU names per node) and shipped.json's source."""
    facts = record.get("node_facts") or []
    gpus = tuple(len(f["gpu_names"]) if isinstance(f, dict) and isinstance(f.get("gpu_names"), list) else None
                 for f in facts)
    from launcher.transport.outputs import SHIPPED_FILE  # (paramiko: a local run ships nothing, has no file)

    source = None
    try:
        named = json.loads((run_path / SHIPPED_FILE).read_text()).get("source")
        source = Path(named) if isinstance(named, str) and Path(named).is_dir() else None
    except (OSError, ValueError, AttributeError):
        pass
    return RunHints(gpus, source, str(record.get("run_id") or ""))


def exit_abort_hint(lines: Sequence[str]) -> str | None:
    """torch aborted the process in its native code with no Python error (_EXIT_ABORT): its known cause with gloo,
    and the two lines that avoid it."""
    if not any(line.strip().endswith(_EXIT_ABORT) for line in lines) or any("Traceback" in line for line in lines):
        return None
    return ("torch aborted this process in its native code, with no Python error (\"terminate called without an "
            "active exception\"): with gloo, torch 2.13 does so as a process exits while a DDP model is still "
            "alive; free it before destroy_process_group() (`del model; gc.collect()`)")
