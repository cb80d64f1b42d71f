"""What a runtime is to the rest of the launcher: it turns one node of a plan into the command that starts it.

Planning depends on this interface only; `native` (torchrun on the host) and `docker` (a container of the trainer
image) implement it, so adding a runtime adds a module here instead of another `if runtime == ...` elsewhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from launcher.planning.plan import NodeHost, NodePlan
    from launcher.spec.run_spec import RunSpec


class NodeRuntime(Protocol):
    """How a node runs on a host."""

    @property
    def name(self) -> str:
        """The name recorded in run.json and shown by --dry-run: "native" or "docker"."""
        ...

    @property
    def image(self) -> str | None:
        """The image its nodes run (None: the host's own python)."""
        ...

    @property
    def runs_host_torch(self) -> bool:
        """Whether the host's own python and torch run the trainer (so preflight must check their versions)."""
        ...

    @property
    def detach_reads_env_file(self) -> bool:
        """Whether the detach script exports the node's environment file (else the node's wrapper reads it)."""
        ...

    @property
    def stop_grace_seconds(self) -> int:
        """How long stopping a node waits before killing what is left of it."""
        ...

    def env_file(self, node: NodePlan) -> tuple[str, bytes]:
        """The file that carries the node's environment to its host: its name in the workspace, and its bytes."""
        ...

    def plan_node(self, spec: RunSpec, index: int, host: NodeHost, rdzv_addr: str, workspace: str) -> NodePlan:
        """Node `index` of `spec` on `host`: its command, environment and working directory (pure)."""
        ...
