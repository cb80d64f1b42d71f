"""Preflight: what each host has (python, torch, GPUs, cores, disk, addresses) and whether every node can
reach node 0's rendezvous address — checked before anything is started. `ddpctl doctor` prints it."""

from __future__ import annotations

import ipaddress
import math
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from launcher.errors import DdpctlError, HostError
from launcher.planning.facts import HostFacts
from launcher.planning.host_round import ProbeAnswer, run_probe
from launcher.planning.rdzv_reservation import listening_port
from launcher.transport.connection import HostConnection
from launcher.transport.parallel import HostOutcome, raise_for_errors

if TYPE_CHECKING:
    from launcher.spec.run_spec import RunSpec

MIN_FREE_DISK = 1 << 30  # bytes: snapshots and logs of a small run fit easily
REACH_TIMEOUT = 10.0  # seconds another node gets to connect to node 0's rendezvous port


def probe_host(conn: HostConnection, python: str, label: str, timeout: float = 60.0) -> HostFacts:
    """Run the probe on one host (launcher/planning/host_round.py); a missing python or an unparsable answer is
    that host's error."""
    return run_probe(conn, python, label, timeout=timeout).facts


class Problem(NamedTuple):
    """One reason a run cannot start: on one host (`host` is its label) or between hosts (`host` is None)."""

    host: str | None
    text: str

    def __str__(self) -> str:
        return f"{self.host}: {self.text}" if self.host else self.text


def check_requirements(facts: list[HostFacts], gpus: int, runs_host_torch: bool,
                       spec: RunSpec | None = None) -> list[Problem]:
    """Problems that stop a run: too few GPUs/cores, too little disk for the run's snapshots and logs (`spec`'s
    estimate; without a spec, MIN_FREE_DISK); where the hosts' own python and torch run the trainer (native
    runtime), missing torch and versions that differ. A container brings its own of both."""
    problems = []
    for f in facts:
        if runs_host_torch and not f.torch:
            problems.append(Problem(f.label, f"torch is not importable by {f.executable or 'its python'} "
                                    f"({f.torch_error or 'not installed'}): give one that has it with --python PATH"))
        if f.slots < gpus:
            kind = "GPUs" if f.gpus else "CPU cores (no GPU)"
            problems.append(Problem(f.label, f"--gpus {gpus} but the host has {f.slots} {kind}"))
        if spec is not None and f.disk_free < planned_disk_bytes(spec):
            problems.append(Problem(f.label, disk_shortfall(spec, f.disk_free, "~/.ddpctl/runs")))
        elif spec is None and f.disk_free < MIN_FREE_DISK:
            problems.append(Problem(f.label, f"less than 1 GiB free in {f.home}"))
    for key in ("python", "torch") if runs_host_torch else ():
        versions = {f.label: _major_minor(getattr(f, key)) for f in facts}
        if len(set(versions.values())) > 1:
            listing = ", ".join(f"{label} {v}" for label, v in versions.items())
            problems.append(Problem(None, f"{key} versions differ between nodes ({listing}): "
                                          "use the same on every node"))
    return problems


def _major_minor(version: Any) -> str:
    return ".".join(str(version).split(".")[:2]) if version else "none"


def reached_port(outcomes: list[HostOutcome[int, ProbeAnswer]], labels: list[str], addr: str, port: int) -> int:
    """Node 0's rendezvous port, from the probes' answers (every host answered), once every other node reached
    it; else node 0's refusal (HostError) or the nodes that could not reach it (HostsFailed)."""
    node0 = outcomes[0].value
    assert node0 is not None
    addr = node0.addr or addr
    chosen = listening_port(labels[0], node0.listen or "", addr, port)
    reached: list[HostOutcome[int, str]] = []
    for index, outcome in enumerate(outcomes[1:], start=1):
        said = outcome.value.connect if outcome.value is not None else None
        reached.append(HostOutcome(index, labels[index], said, None if said == "ok" else HostError(
            labels[index], f"cannot reach node 0's rendezvous address {addr}:{chosen} ({said or 'not tried'}); "
                           "check the network or pass --rdzv-addr")))
    raise_for_errors(reached, "rendezvous check")
    return chosen


def check_public_rendezvous(addr: str, facts: list[HostFacts], allow_public: bool) -> None:
    """torchrun's stores have no authentication and listen on every address of a node (node 0's, and the one
    holding rank 0 opens another): refuse a run where the rendezvous address or any node's own address is
    public, unless told that a firewall keeps the ports to the nodes."""
    if allow_public:
        return
    public = [f"{addr} (the rendezvous address)"] if _is_global(addr) else []
    public += [f"{a.addr} on {f.label}" for f in facts for a in f.addrs if _is_global(a.addr)]
    if public:
        raise DdpctlError(
            f"public address {public[0]}{f' and {len(public) - 1} more' if len(public) > 1 else ''}: torchrun's "
            "rendezvous stores listen on every address of a node, have no authentication, and anyone reaching "
            "them can run code on your nodes; use hosts on a private network without public addresses or, if a "
            "firewall restricts the ports to the nodes, pass --allow-public-rendezvous"
        )


def _is_global(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_global
    except ValueError:
        return False  # a name: resolved by the nodes; their own addresses are judged instead


# --- disk: what a run will write, against what a host (or this machine) has free -----------------------------

# Elements in each model's state_dict (weights and buffers, 10 classes), counted with torch for 3x32x32 images
# (the larger of MNIST's and CIFAR-10's shapes); the launcher cannot import torch to count them.
MODEL_ELEMENTS = {"mnist-cnn": 31_340, "mnist-cnn-small": 12_834, "resnet18": 11_191_262}
BYTES_PER_ELEMENT = 4  # fp32: bf16 runs keep fp32 weights and optimizer state too
SNAPSHOT_OVERHEAD = 256 << 10  # torch.save's framing, the epoch records
RNG_BYTES_PER_RANK = 16 << 10  # every rank's RNG states go into each snapshot
LOG_ALLOWANCE = 64 << 20  # torchrun's and the workers' logs, timing/progress records
LOW_SPACE_MINIMUM = 16 << 20


def _trainer_option(spec: RunSpec, name: str, default: float) -> float:
    """A trainer option given through to the trainer (`--keep-snapshots 2`, `--momentum=0.9`), else `default`."""
    args = list(spec.trainer_args)
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            text = args[i + 1]
        elif arg.startswith(name + "="):
            text = arg.partition("=")[2]
        else:
            continue
        try:
            return float(text)
        except ValueError:
            return default
    return default


def snapshot_bytes(spec: RunSpec) -> int:
    """One snapshot file: weights plus optimizer state (SGD keeps a momentum buffer only with momentum)."""
    if spec.user_command:
        return 0
    copies = 2 if _trainer_option(spec, "--momentum", 0.0) > 0 else 1
    world = spec.nnodes * spec.nproc_per_node
    weights = MODEL_ELEMENTS.get(spec.model, 0) * BYTES_PER_ELEMENT
    return weights * copies + SNAPSHOT_OVERHEAD + RNG_BYTES_PER_RANK * world


def planned_disk_bytes(spec: RunSpec) -> int:
    """What one node writes: its snapshots (the newest K, plus one being written; local-sgd keeps one set per
    process), final_model.pt and LOG_ALLOWANCE."""
    if spec.user_command:
        return LOG_ALLOWANCE
    saves = math.ceil(spec.epochs / spec.save_every)
    held = min(int(_trainer_option(spec, "--keep-snapshots", 3)), saves) + 1
    sets = spec.nproc_per_node if spec.strategy == "local-sgd" else 1
    final_model = MODEL_ELEMENTS.get(spec.model, 0) * BYTES_PER_ELEMENT
    return held * sets * snapshot_bytes(spec) + final_model + LOG_ALLOWANCE


def disk_shortfall(spec: RunSpec, free: int, where: str) -> str:
    """One line: how much the run needs in `where` and how much is free, and what to do."""
    held = min(int(_trainer_option(spec, "--keep-snapshots", 3)), math.ceil(spec.epochs / spec.save_every))
    return (f"needs {_mib(planned_disk_bytes(spec))} free in {where} for {held} snapshot(s) of "
            f"{_mib(snapshot_bytes(spec))} and logs, but {_mib(free)} is free: free some space there, keep fewer "
            "snapshots (`--trainer-arg=--keep-snapshots=1`) or save less often (--save-every)")


def check_local_disk(spec: RunSpec, run_path: Path) -> None:
    """Refuse a local run whose run directory's disk has no room for its snapshots and logs (one line)."""
    where = run_path
    while not where.is_dir() and where.parent != where:
        where = where.parent
    try:
        free, on_disk = shutil.disk_usage(where).free, os.statvfs(where)
    except OSError:
        return
    if on_disk.f_blocks == 0:  # proc, sysfs, cgroup: no room is no shortage of space
        raise DdpctlError(f"--runs-dir {run_path.parent}: {where} is a kernel file system (as /proc and /sys are), "
                          "not a disk: pass --runs-dir on a disk, e.g. --runs-dir runs")
    if on_disk.f_flag & os.ST_RDONLY:
        raise DdpctlError(f"--runs-dir {run_path.parent}: {where} is on a read-only file system: pass --runs-dir "
                          "on a writable disk, e.g. --runs-dir runs")
    if free < planned_disk_bytes(spec):
        raise DdpctlError(f"--runs-dir {run_path.parent}: this run {disk_shortfall(spec, free, str(where))}, or "
                          "pass --runs-dir on a disk with room")


def low_space_floor(spec: RunSpec | None) -> int:
    """Free bytes below which a running node is warned about: room for two more snapshots, at least 16 MiB."""
    return max(LOW_SPACE_MINIMUM, 2 * snapshot_bytes(spec)) if spec is not None else LOW_SPACE_MINIMUM


def _mib(count: int) -> str:
    return f"{count / (1 << 20):.1f} MiB" if count < (1 << 30) else f"{count / (1 << 30):.2f} GiB"
