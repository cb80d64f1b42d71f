"""Which runtime a run's nodes use: `--runtime native`, `docker`, or `auto` (docker when every host has a working
Docker engine, as the probe's round trip found it). The probe (launcher/planning/probe.py) is handed
`choose_runtime`, so planning never imports a concrete runtime."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from launcher.runtimes.docker import DEFAULT_IMAGE, DockerRuntime
from launcher.runtimes.docker_hosts import docker_info_argv, docker_info_from, require_engine
from launcher.runtimes.native import NativeRuntime
from launcher.transport.parallel import raise_for_errors, run_on_hosts

if TYPE_CHECKING:
    from launcher.planning.plan import NodeRuntime
    from launcher.planning.request import UpOptions


def image_name(options: UpOptions) -> str:
    """The image docker nodes run: --registry's reference, else --image, else ddpctl's default."""
    return options.registry or options.image or DEFAULT_IMAGE


class RuntimeChooser:
    """What the probe asks of the runtimes: which check each host runs within its probe round trip (the Docker
    engine check, unless the runtime is native), and the runtime chosen from the answers."""

    def host_checks(self, options: UpOptions) -> list[list[str]]:
        """The argv each host runs in the probe's round trip (none for native)."""
        return [] if options.runtime == "native" else [docker_info_argv(image_name(options))]

    def choose(self, options: UpOptions, labels: Sequence[str], answers: Sequence[Any]
               ) -> tuple[NodeRuntime, tuple[bool, ...] | None]:
        """native, or docker with whether each host's engine has the NVIDIA runtime. `auto` takes docker when every
        host has a working engine (one runtime per run: the nodes then share the image's python and torch).
        `answers`: each host's result of host_checks' check (`stdout`, `stderr`), in host order."""
        if options.runtime == "native":
            return NativeRuntime(), None
        infos = [docker_info_from(answer) for answer in answers]
        if options.runtime == "auto" and not all(i.has_engine for i in infos):
            return NativeRuntime(), None
        if options.runtime == "docker":
            outcomes = run_on_hosts(list(range(len(infos))), lambda i: require_engine(infos[i], labels[i]),
                                    timeout=10, label=lambda i: labels[i])
            infos = raise_for_errors(outcomes, "docker runtime")
        return DockerRuntime(image_name(options)), tuple(i.nvidia_runtime for i in infos)


# Handed to the probe (launcher/planning/probe.py), which knows runtimes only through this.
choose_runtime = RuntimeChooser()


def runtime_unprobed(options: UpOptions) -> NodeRuntime:
    """The runtime a plan made without the hosts shows: docker when asked for, else native (`auto` is named as
    unknown in that plan)."""
    return DockerRuntime(image_name(options)) if options.runtime == "docker" else NativeRuntime()
