"""What the login node tells about the cluster, and the preflight refusals drawn from it (read-only).

Every query is a Slurm client command run on the login node over SSH (argv quoted by the transport), parsed from
the `-o` one-line forms that Slurm has printed the same way for years (`scontrol ... -o`, `sinfo -h -o`)."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from launcher.errors import DdpctlError, HostError, SpecError
from launcher.remote import login_probe, tree_sync
from launcher.remote.program import program
from launcher.spec.run_spec import RunSpec
from launcher.spec.slurm_request import SlurmRequest, time_minutes
from launcher.transport.ssh import Connection

DEFAULT_WORKDIR = "~/.ddpctl/slurm"
QUERY_TIMEOUT = 60
# Run by the login node's --python (launcher/remote/login_probe.py): the workdir there, torch for it, and the code
# cache's listing (tree_sync's, shipping's comparison) in the same round trip.
LOGIN_PROBE = program(login_probe, tree_sync)


@dataclass(frozen=True)
class Partition:
    """One partition as `scontrol show partition -o` and `sinfo` report it."""

    name: str
    state: str  # UP, DOWN, DRAIN, INACTIVE
    max_minutes: float | None  # None: UNLIMITED
    total_nodes: int
    gpus_per_node: list[int]  # one entry per node: its GPUs (gres gpu), 0 for CPU-only nodes
    cpus_per_node: list[int]


@dataclass(frozen=True)
class ClusterFacts:
    """What the plan needs from the cluster."""

    partition: Partition
    select_type: str  # e.g. select/cons_tres (takes --gpus-per-node)
    workdir: str  # absolute, on the login node
    python: str
    torch: str | None
    code_listing: object = None  # the code cache's manifest (tree_sync's JSON data), where it was asked for


def key_values(line: str) -> dict[str, str]:
    """`A=1 B=x y C=2` (scontrol's -o form) -> {A: 1, B: "x y", C: 2}: a value runs to the next ` Key=`."""
    found = list(re.finditer(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=", line))
    values = {}
    for i, m in enumerate(found):
        end = found[i + 1].start() if i + 1 < len(found) else len(line)
        values[m.group(1)] = line[m.end():end].strip()
    return values


def gpu_count(gres: str) -> int:
    """GPUs in a node's Gres field (`gpu:4`, `gpu:a100:2(S:0-1)`, `(null)`)."""
    total = 0
    for item in gres.split(","):
        parts = item.split("(")[0].split(":")
        if parts[0] == "gpu" and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def _slurm(conn: Connection, argv: list[str], what: str) -> str:
    result = conn.run(argv, timeout=QUERY_TIMEOUT)
    if result.exit_code == 127:
        raise HostError(conn.label, f"{argv[0]} not found: is this a Slurm login node (is Slurm's bin on PATH "
                                    "for non-interactive SSH sessions)?")
    if not result.ok:
        tail = (result.stderr.strip() or result.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise HostError(conn.label, f"{what} failed: {tail[0]}")
    return result.stdout


def read_partition(conn: Connection, name: str | None) -> Partition:
    """The partition asked for (or the cluster's default); DdpctlError naming the ones there are if missing."""
    lines = [line for line in _slurm(conn, ["scontrol", "show", "partition", "-o"], "scontrol show partition")
             .splitlines() if line.strip()]
    parts = [key_values(line) for line in lines]
    names = [p.get("PartitionName", "") for p in parts]
    if name is None:
        chosen = next((p for p in parts if p.get("Default") == "YES"), None)
        if chosen is None:
            raise DdpctlError(f"the cluster has no default partition: pick one with --partition ({', '.join(names)})")
    else:
        chosen = next((p for p in parts if p.get("PartitionName") == name), None)
        if chosen is None:
            raise DdpctlError(f"partition {name!r} does not exist on the cluster: choose one of {', '.join(names)}")
    pname = chosen["PartitionName"]
    max_time = chosen.get("MaxTime", "UNLIMITED")
    nodes = _slurm(conn, ["sinfo", "-h", "-N", "-p", pname, "-o", "%N|%c|%G"], "sinfo").splitlines()
    rows = [row.split("|") for row in nodes if row.count("|") == 2]
    return Partition(name=pname, state=chosen.get("State", "UNKNOWN"),
                     max_minutes=None if max_time in ("UNLIMITED", "INFINITE") else time_minutes(max_time),
                     total_nodes=int(chosen.get("TotalNodes", "0") or 0),
                     gpus_per_node=[gpu_count(r[2]) for r in rows], cpus_per_node=[int(r[1]) for r in rows
                                                                                    if r[1].isdigit()])


def read_select_type(conn: Connection) -> str:
    for line in _slurm(conn, ["scontrol", "show", "config"], "scontrol show config").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "SelectType":
            return value.strip()
    return "unknown"


def probe_login(conn: Connection, python: str, workdir: str | None, prelude: tuple[str, ...] = (),
                code_cache: str | None = None) -> dict[str, object]:
    """The login node's answer to LOGIN_PROBE (run by `python`, after the --prelude lines as the job runs them)."""
    argv = [python, "-c", LOGIN_PROBE, workdir or DEFAULT_WORKDIR, *([code_cache] if code_cache else [])]
    if prelude:  # the user's own shell lines, run as the batch script runs them; our values stay arguments
        argv = ["bash", "-c", "\n".join(prelude) + '\nexec "$@"', "ddpctl-probe", *argv]
    result = conn.run(argv, timeout=QUERY_TIMEOUT)
    if result.exit_code == 127:
        raise DdpctlError(f"{python} not found on {conn.label}: name the cluster's Python with --python "
                          "(e.g. a venv's bin/python on the shared file system)")
    try:
        answer = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise HostError(conn.label, f"{python} could not check the workdir: {result.stderr.strip()[-200:]}") from None
    return dict(answer)


def read_facts(conn: Connection, spec: RunSpec, request: SlurmRequest, code_cache: str | None = None) -> ClusterFacts:
    """Probe the cluster (read-only) and refuse, in one line each, what cannot run there. `code_cache`: the code
    cache under the workdir (`code/<key>`) the login probe lists too, for shipping to compare against."""
    # Four channels of the one SSH connection at once: the login Python's answer, the partition (scontrol, then
    # sinfo), Slurm's configuration, and SFTP (which shipping and the pull use: a login node without it is named
    # here, before anything is written); each a round trip that need not wait for another's.
    with ThreadPoolExecutor(max_workers=3, thread_name_prefix="ddpctl-login-probe") as pool:
        asked = pool.submit(probe_login, conn, spec.python, request.workdir, request.prelude, code_cache)
        select = pool.submit(read_select_type, conn)
        sftp = pool.submit(lambda: conn.sftp)
        partition = read_partition(conn, request.partition)
        login, select_type, _ = asked.result(), select.result(), sftp.result()
    facts = ClusterFacts(partition=partition, select_type=select_type, workdir=str(login["workdir"]),
                         python=str(login.get("python")), torch=login.get("torch"),  # type: ignore[arg-type]
                         code_listing=login.get("manifest"))
    refusal = preflight_refusal(spec, request, facts, login)
    if refusal:
        raise SpecError(refusal)
    return facts


def preflight_refusal(spec: RunSpec, request: SlurmRequest, facts: ClusterFacts, login: dict[str, object]) -> str:
    """Why the job cannot run as asked (empty: it can). Pure, from what the cluster reported."""
    unset = login.get("unset")
    if isinstance(unset, list) and unset:
        names = ", ".join(f"${name}" for name in unset)
        return (f"--workdir {request.workdir}: {names} {'is' if len(unset) == 1 else 'are'} not set on the login "
                "node: give the folder's path, or name variables set there (e.g. $HOME, $SCRATCH)")
    part = facts.partition
    if part.state != "UP":
        return f"partition {part.name} is {part.state}: pick another with --partition (`sinfo` lists them)"
    if spec.nnodes > part.total_nodes:
        return f"partition {part.name} has {part.total_nodes} node(s), not the {spec.nnodes} asked with --nodes"
    if request.time is not None and part.max_minutes is not None and time_minutes(request.time) > part.max_minutes:
        return (f"--time {request.time} is over partition {part.name}'s MaxTime ({_minutes(part.max_minutes)}): "
                "ask less, or use --requeue to train across several jobs")
    if any(part.gpus_per_node):
        with_gpus = sum(1 for g in part.gpus_per_node if g >= spec.nproc_per_node)
        if with_gpus < spec.nnodes:
            most = max(part.gpus_per_node)
            return (f"partition {part.name} has {with_gpus} node(s) with {spec.nproc_per_node} GPUs, {spec.nnodes} "
                    f"needed (its nodes have at most {most}): lower --gpus or --nodes, or pick another partition")
    elif part.cpus_per_node and spec.nproc_per_node > max(part.cpus_per_node):
        return (f"partition {part.name} has no GPUs and at most {max(part.cpus_per_node)} CPUs per node: --gpus "
                f"{spec.nproc_per_node} processes per node do not fit")
    if not login.get("writable"):
        return f"the workdir {facts.workdir} is not writable on the login node ({login.get('why')}): pick --workdir"
    if login.get("torch") is None:
        return (f"{spec.python} on the login node cannot import torch ({login.get('torch_error')}): name a Python "
                "with torch with --python, or set it up with --prelude (e.g. 'module load pytorch')")
    return ""


def default_gpus_note(spec: RunSpec, request: SlurmRequest, part: Partition) -> str:
    """What --gpus left to its default (1 process per node) means on this partition (empty when --gpus was given,
    or when 1 is all its nodes have)."""
    if request.gpus_given or spec.nproc_per_node != 1:
        return ""
    if any(part.gpus_per_node):
        most = max(part.gpus_per_node)
        return "" if most <= 1 else (f"--gpus not given: 1 process and 1 GPU per node, while partition {part.name}'s "
                                     f"nodes have up to {most} GPUs: give --gpus {most} to use them")
    cpus = max(part.cpus_per_node) if part.cpus_per_node else None
    has = f" (its nodes have {cpus} CPUs)" if cpus else ""
    return (f"--gpus not given: 1 process per node on partition {part.name}, which has no GPUs{has}; give --gpus N "
            "for N processes (and CPUs) per node")


def _minutes(minutes: float) -> str:
    whole = int(minutes)
    days, rest = divmod(whole, 1440)
    return (f"{days}-" if days else "") + f"{rest // 60:02d}:{rest % 60:02d}:00"
