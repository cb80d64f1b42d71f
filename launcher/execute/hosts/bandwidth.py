"""The network between the nodes, measured (`ddpctl doctor --bandwidth`, `ddpctl up --check-bandwidth`):
all-reduce bus bandwidth and latency with the backend a run would use (gloo on CPU, NCCL on GPUs) over the
interface it would use, by trainer/bandwidth.py started on every node at once over SSH (its text is sent: the
hosts need their python with torch, nothing of ddpctl). nccl-tests' definitions: algbw = bytes / time, busbw =
algbw * 2(n-1)/n. The figures are as measured; none is ever filled in."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import launcher
from launcher.errors import DdpctlError
from launcher.planning.facts import HostFacts
from launcher.results.progress import console
from launcher.spec.gradient_size import DEFAULT_MODEL, gradient_bytes
from launcher.transport.connection import HostConnection
from launcher.transport.parallel import run_on_hosts

if TYPE_CHECKING:
    from launcher.planning.plan import RunPlan
    from launcher.transport.hostsession import HostSession

# trainer/bandwidth.py as the nodes run it (it imports torch: the launcher reads its text, never imports it).
PROGRAM = Path(launcher.__file__).resolve().parent.parent / "trainer" / "bandwidth.py"  # beside launcher/
RESULT_MARK = "DDPCTL_BANDWIDTH "
SECONDS = 120  # each node's own limit (it ends itself then), so that a lost peer leaves nothing running


def backend_for(facts: Sequence[HostFacts]) -> str:
    """NCCL where every node has GPUs and a CUDA build of torch, else gloo (as the trainer's --backend auto)."""
    return "nccl" if facts and all(f.gpus and f.torch_cuda for f in facts) else "gloo"


def node_argv(python: str, facts: Sequence[HostFacts], index: int, port: int, max_bytes: int) -> list[str]:
    """What node `index` runs: the program with its rank, node 0's address and the interface of its own address
    (the one the run's GLOO_SOCKET_IFNAME names)."""
    addr0 = facts[0].address
    if not addr0:
        raise DdpctlError(f"{facts[0].label}: no address the other nodes could reach it at was found")
    own = facts[index]
    return [python, "-c", PROGRAM.read_text(encoding="utf-8"), str(index), str(len(facts)), addr0, str(port),
            own.iface_of(own.address) or "", str(max_bytes), backend_for(facts), str(SECONDS)]


def measure(conns: Sequence[HostConnection], facts: Sequence[HostFacts], *, python: str, port: int,
            max_bytes: int) -> dict[str, Any]:
    """Run the measurement on every node at once; rank 0's figures, with the hosts named (the interfaces each
    used, the slowest pair for more than two nodes). A node that failed: DdpctlError naming it, one line."""
    labels = [f.label for f in facts]

    def on_node(index: int) -> Any:
        return conns[index].run(node_argv(python, facts, index, port, max_bytes), timeout=SECONDS + 30)

    outcomes = run_on_hosts(list(range(len(facts))), on_node, timeout=SECONDS + 40, label=lambda i: labels[i])
    for outcome in outcomes:
        result = outcome.value
        if result is None or outcome.error is not None:
            raise DdpctlError(f"{outcome.label}: the bandwidth measurement failed: {outcome.error}")
        if result.exit_code != 0:
            why = _last_line(result.stderr) or f"exit {result.exit_code}"
            raise DdpctlError(f"{outcome.label}: the bandwidth measurement failed: {why}")
    return figures(str(outcomes[0].value.stdout if outcomes[0].value is not None else ""), facts)


def figures(stdout: str, facts: Sequence[HostFacts]) -> dict[str, Any]:
    """Rank 0's result line as the record keeps it: busbw_gbit_s and latency_ms first, then how they were got."""
    line = next((line for line in stdout.splitlines() if line.startswith(RESULT_MARK)), None)
    if line is None:
        raise DdpctlError(f"{facts[0].label}: the bandwidth measurement printed no result")
    found = json.loads(line[len(RESULT_MARK):])
    labels = [f.label for f in facts]
    result: dict[str, Any] = {"busbw_gbit_s": found["busbw_gbit_s"], "latency_ms": found["latency_ms"],
                              "backend": found["backend"], "nodes": labels, "max_bytes": found["max_bytes"],
                              "ifaces": [f.iface_of(f.address) for f in facts], "sizes": found["sizes"]}
    if found.get("pairs"):
        pairs = [{"hosts": [labels[i] for i in p["nodes"]], "busbw_gbit_s": p["busbw_gbit_s"]}
                 for p in found["pairs"]]
        result["pairs"] = pairs
        result["slowest_pair"] = min(pairs, key=lambda p: p["busbw_gbit_s"])
    return result


def summary_lines(result: dict[str, Any]) -> list[str]:
    """What people read: the figures, with the size they were measured at, and the slowest pair."""
    ifaces = ", ".join(i or "?" for i in result["ifaces"])
    lines = [f"all-reduce ({result['backend']}, {len(result['nodes'])} nodes over {ifaces}): bus bandwidth "
             f"{result['busbw_gbit_s']:.3g} Gbit/s at {result['max_bytes']:,} B (the gradient), latency "
             f"{result['latency_ms']:.3g} ms at {result['sizes'][0]['bytes']} B"]
    if "slowest_pair" in result:
        slow = result["slowest_pair"]
        lines.append(f"slowest pair: {' and '.join(slow['hosts'])}, {slow['busbw_gbit_s']:.3g} Gbit/s")
    return lines


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def before_run(session: HostSession, plan: RunPlan) -> dict[str, Any]:
    """`up --check-bandwidth`: the measurement on the run's hosts, over the interfaces and with the backend the run
    will use, up to its model's gradient (our trainer's; a `-- CMD` run's model is unknown: the default model's),
    on its rendezvous port (reserved for the run, free until it starts); printed, and returned for run.json."""
    spec = plan.spec
    facts = list(plan.node_facts)
    without = [f.label for f in facts if not f.torch]
    if without:
        raise DdpctlError(f"--check-bandwidth runs on the hosts' own python ({spec.python}), which needs torch: "
                          f"{', '.join(without)} has none (a Docker runtime's torch is in its image): install it "
                          "there, or drop --check-bandwidth")
    model = spec.model if not spec.user_command else DEFAULT_MODEL
    result = measure([session.conn(i) for i in range(len(facts))], facts, python=spec.python, port=spec.rdzv_port,
                     max_bytes=gradient_bytes(model, spec.dataset))
    result["model"] = model
    for line in summary_lines(result):
        console.print(line, markup=False, highlight=False)
    return result
