"""A Docker engine of its own for a test-bed host: a second dockerd inside the host's network namespace.

It has its own data root, exec root and socket, and its socket belongs to the host's login user's group, so
over SSH that user sees a separate Docker host (DOCKER_HOST is set in the user's SSH sessions); a
`--network host` container there sits on the host's address. Started with nsenter, not `ip netns exec` (which
remounts /sys, and dockerd then fails with "Devices cgroup isn't mounted").

    engine = start_engine(host)     # ... engine.docker("images") runs the CLI against it from here
    engine.stop()                   # before the bed stops (the bed SIGKILLs what is left in the namespace)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from infra.testbed_host import (
    TestbedError,
    TestHost,
    kill_and_wait,
    process_state,
    read_pid,
    remove_mounted_tree,
)


@dataclass
class HostEngine:
    """A running dockerd for one test-bed host."""

    host: TestHost
    socket: str
    data_root: str
    exec_root: str
    pidfile: str
    log: str

    @property
    def docker_host(self) -> str:
        return f"unix://{self.socket}"

    def docker(self, *args: str, check: bool = True, timeout: float = 300,
               input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        """Run the docker CLI against this engine (as root, from this machine)."""
        proc = subprocess.run(["docker", "-H", self.docker_host, *args], capture_output=True, timeout=timeout,
                              input=input)
        if check and proc.returncode != 0:
            raise TestbedError(f"{self.host.name}: docker {' '.join(args)} exited {proc.returncode}: "
                               f"{proc.stderr.decode(errors='replace').strip()}")
        return proc

    def stop(self) -> None:
        """Stop the engine (it stops its containers), forget DOCKER_HOST, remove its files."""
        pid = read_pid(Path(self.pidfile))
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 20
            while process_state(pid) not in (None, "Z") and time.monotonic() < deadline:
                time.sleep(0.1)
            kill_and_wait([pid])
        env = self.host.ssh_environment()
        if env.pop("DOCKER_HOST", None) is not None:
            self.host.set_ssh_environment(env)
        for root in (self.data_root, self.exec_root):
            remove_mounted_tree(root)
        Path(self.socket).unlink(missing_ok=True)


def start_engine(host: TestHost, timeout: float = 60, insecure_registries: tuple[str, ...] = (),
                 extra_runtimes: tuple[str, ...] = ()) -> HostEngine:
    """Start a dockerd in `host`'s namespace, usable by its login user over SSH; wait until it answers.

    `insecure_registries` (HOST:PORT) may be reached over plain HTTP, e.g. a test registry on the bed's bridge.
    `extra_runtimes` are registered as OCI runtimes backed by runc: "nvidia" makes the engine look like one with
    NVIDIA's container runtime, as far as `docker info` tells (there is no GPU behind it).
    """
    engine = HostEngine(
        host=host,
        socket=f"/run/{host.name}-docker.sock",
        data_root=f"{host.dir}/docker-data",
        # containerd's shim sockets live below the exec root and unix socket paths are short: keep it in /run.
        exec_root=f"/run/{host.name}-docker",
        pidfile=f"/run/{host.name}-docker.pid",
        log=f"{host.dir}/dockerd.log",
    )
    argv = [*host.nsenter(), "dockerd", "--data-root", engine.data_root, "--exec-root", engine.exec_root,
            "-H", engine.docker_host, "--pidfile", engine.pidfile, "--group", host.user,
            "--bridge", "none", "--iptables=false", "--ip-masq=false", "--log-level", "warn",
            *(f"--insecure-registry={registry}" for registry in insecure_registries),
            *(f"--add-runtime={name}=runc" for name in extra_runtimes)]
    # The test registries are reached straight: under the suite's cut from the internet (HTTPS through a proxy that
    # refuses) a newer dockerd does not fall back to plain HTTP for an insecure registry once the proxy refused.
    env = dict(os.environ)
    direct = [registry.rsplit(":", 1)[0] for registry in insecure_registries]
    for name in ("NO_PROXY", "no_proxy"):
        if direct:
            env[name] = ",".join(x for x in (env.get(name, ""), *direct) if x)
    # setsid --fork: dockerd becomes init's child, so once stopped it is reaped rather than left a zombie of ours.
    with open(engine.log, "ab") as log:
        subprocess.run(["setsid", "--fork", *argv], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                       check=True, env=env)
    deadline = time.monotonic() + timeout
    while engine.docker("info", check=False, timeout=30).returncode != 0:
        if time.monotonic() > deadline:
            tail = Path(engine.log).read_text(errors="replace")[-2000:]
            engine.stop()
            raise TestbedError(f"{host.name}: dockerd did not answer within {timeout:g} s; its log:\n{tail}")
        time.sleep(0.5)
    host.update_ssh_environment({"DOCKER_HOST": engine.docker_host})
    return engine
