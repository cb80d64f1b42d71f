"""Which runtime a run's nodes use: `--runtime native`, `docker`, or `auto` (docker when every host has a working
Docker engine). The probe (launcher/planning/probe.py) is handed `choose_runtime`, so planning never imports a
concrete runtime."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.runtimes.docker import DEFAULT_IMAGE, DockerRuntime
from launcher.runtimes.docker_hosts import host_docker_info, require_engine
from launcher.runtimes.native import NativeRuntime
from launcher.transport.parallel import raise_for_errors, run_on_hosts

if TYPE_CHECKING:
    from launcher.planning.plan import NodeRuntime
    from launcher.planning.request import UpOptions
    from launcher.transport.hostsession import HostSession


def image_name(options: UpOptions) -> str:
    """The image docker nodes run: --registry's reference, else --image, else ddpctl's default."""
    return options.registry or options.image or DEFAULT_IMAGE


def choose_runtime(options: UpOptions, session: HostSession) -> tuple[NodeRuntime, tuple[bool, ...] | None]:
    """native, or docker with whether each host's engine has the NVIDIA runtime. `auto` takes docker when every
    host has a working engine (one runtime per run: the nodes then share the image's python and torch)."""
    if options.runtime == "native":
        return NativeRuntime(), None
    image = image_name(options)
    outcomes = run_on_hosts(list(range(len(session.targets))),
                            lambda i: host_docker_info(session.conn(i), image), timeout=90, label=session.label_of)
    infos = raise_for_errors(outcomes, "docker check")
    if options.runtime == "auto" and not all(i.has_engine for i in infos):
        return NativeRuntime(), None
    if options.runtime == "docker":
        outcomes = run_on_hosts(list(range(len(infos))), lambda i: require_engine(infos[i], session.label_of(i)),
                                timeout=10, label=session.label_of)
        infos = raise_for_errors(outcomes, "docker runtime")
    return DockerRuntime(image), tuple(i.nvidia_runtime for i in infos)


def runtime_unprobed(options: UpOptions) -> NodeRuntime:
    """The runtime a plan made without the hosts shows: docker when asked for, else native (`auto` is named as
    unknown in that plan)."""
    return DockerRuntime(image_name(options)) if options.runtime == "docker" else NativeRuntime()
