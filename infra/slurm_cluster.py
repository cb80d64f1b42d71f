"""A real Slurm cluster in the test bed: slurmctld and one slurmd per compute host, one munged, no systemd.

The login node is a test-bed host with sshd (hosts[0]); slurmctld runs in its network namespace, and every other
host runs one slurmd (CPU only). Each daemon gets its own UTS namespace with the node's hostname (slurmd finds its
NodeName, slurmctld its SlurmctldHost) and its own mount namespace where the cluster's hosts file is bound over
/etc/hosts, so node names resolve on every node as a cluster's DNS would, and nothing of the machine's own
configuration changes. Namespaces are entered with `nsenter --net=` (not `ip netns exec`, which remounts /sys).
One munged serves every node through a socket of its own (all namespaces share the file system, as cluster
nodes share home). Memory: where cgroup v1's memory hierarchy is writable (this machine's
kind), task/cgroup enforces `--mem` (ConstrainRAMSpace), each node in a memory cgroup folder of its own bound over
the cluster's CgroupMountpoint in its mount namespace; else task/none. Preemption: preempt/partition_prio, a job
in partition `low` is cancelled (PREEMPTED) when one in `high` needs its nodes. Accounting: no slurmdbd;
finished jobs stay in `scontrol show job` for MinJobAge and are written to jobcomp/filetxt (`sacct` answers
nothing here; ddpctl falls back to scontrol). MPI: Debian's Slurm has the pmix plugin (`srun --mpi=list`: pmix,
pmix_v4) and Debian's Open MPI is built against the same PMIx (libpmix2); each node gets its own TmpFS (`tmp-%n`),
where the pmix plugin makes each step's folder, which two nodes sharing /tmp would both claim.
Short chains of requeued jobs (`--requeue`): a requeued job waits AuthInfo's cred_expire before it may start again
(120 s by default, 10 s here), and the scheduler looks at eligible jobs every 2 s (sched_interval, bf_interval;
60 s and 30 s by default); OverTimeLimit stays 0, so a job ends at its limit (Slurm checks limits every 30 s).

The login user's SSH sessions get SLURM_CONF (~/.ssh/environment), as /etc/slurm/slurm.conf would on a cluster.

    with Testbed(n_hosts=3, host_python=True) as bed, SlurmCluster(bed) as cluster:
        cluster.login.spec, cluster.node_names, cluster.partition

By hand: `python -m infra.slurm_cluster start [--nodes 2] | stop`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from infra.testbed import Testbed, TestbedError, TestHost, kill_and_wait, read_pid, start_time

MUNGED = "/usr/sbin/munged"
SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
PARTITION = "debug"
SHORT_PARTITION = "short"  # MaxTime 1 minute: preflight's time-limit refusal
DOWN_PARTITION = "closed"  # State=DOWN: preflight's partition-down refusal
# Preemption (preempt/partition_prio): a job in LOW_PARTITION is cancelled (PREEMPTED) when a job in
# HIGH_PARTITION needs its nodes; the other partitions share HIGH's tier, so nothing else is ever preempted.
LOW_PARTITION, HIGH_PARTITION = "low", "high"
NODE_MEMORY_MB = 4096  # RealMemory of each node: what `--mem` is checked against (the machine has more)
# Enter a fresh UTS and mount namespace, set the hostname, bind the cluster's hosts file, then run the daemon.
# Bind the node's own memory cgroup over the cluster's cgroup mount point (task/cgroup: --mem enforced by the kernel).
_IN_NODE_NS = ('hostname "$0" && mount --bind "$1" /etc/hosts && { [ -z "$2" ] || mount --bind "$2" "$3"; } '
               '&& shift 3 && exec "$@"')
# cgroup v1's memory hierarchy (this machine's kind mounts v1 controllers); each node gets a folder in it.
MEMORY_CGROUP = Path("/sys/fs/cgroup/memory")


@dataclass
class ClusterState:
    """What the cluster started (saved in its directory before each daemon starts), for stop()."""

    dir: str
    pids: dict[str, list[str | int | None]] = field(default_factory=dict)  # daemon name -> [pid, start time]
    cgroups: list[str] = field(default_factory=list)  # the nodes' memory cgroup folders, removed at the end


class SlurmCluster:
    """slurmctld on hosts[0] (the login node), slurmd on hosts[1:]; a context manager, `stop()` removes it all."""

    __test__ = False

    def __init__(self, bed: Testbed, *, cpus_per_node: int | None = None) -> None:
        for tool in (MUNGED, SLURMCTLD, SLURMD):
            if not os.access(tool, os.X_OK):
                raise TestbedError(f"{tool} missing: install slurmctld slurmd slurm-client munge "
                                   "(bash infra/setup.sh --test)")
        if len(bed.hosts) < 2:
            raise TestbedError("a Slurm cluster needs a login host and at least one compute host")
        self.bed = bed
        self.login: TestHost = bed.hosts[0]
        self.nodes: list[TestHost] = bed.hosts[1:]
        self.dir = bed.dir / "slurm"
        self.cpus = cpus_per_node or os.cpu_count() or 1
        self.state = ClusterState(dir=str(self.dir))
        # --mem is enforced (task/cgroup) where cgroup v1's memory hierarchy can be written; else task/none.
        self.memory_enforced = os.access(MEMORY_CGROUP / "cgroup.procs", os.W_OK)
        self.dir.mkdir(mode=0o755)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    @property
    def conf_path(self) -> Path:
        return self.dir / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.dir / "munge" / "munge.socket"

    @property
    def node_names(self) -> list[str]:
        return [h.name for h in self.nodes]

    @property
    def partition(self) -> str:
        return PARTITION

    @property
    def env(self) -> dict[str, str]:
        """Environment for Slurm's client commands on this machine (root namespace)."""
        return {**os.environ, "SLURM_CONF": str(self.conf_path)}

    def slurm(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command (scontrol, squeue, sinfo, ...) from the login node's namespace as root."""
        proc = subprocess.run([*self.login.nsenter(), *argv], capture_output=True, text=True, env=self.env,
                              timeout=timeout)
        if check and proc.returncode != 0:
            raise TestbedError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def node_state(self, name: str) -> str:
        out = self.slurm("sinfo", "-h", "-N", "-n", name, "-o", "%T").stdout.split()
        return out[0] if out else "unknown"

    def kill_slurmd(self, name: str) -> None:
        """SIGKILL one node's slurmd (its jobs' steps keep running until slurmctld declares the node down)."""
        pid = self.state.pids.get(f"slurmd-{name}")
        if pid and isinstance(pid[0], int):
            kill_and_wait([pid[0]])

    def start_slurmd(self, name: str) -> None:
        """Start one node's slurmd again (after kill_slurmd) and wait until the node is back to idle."""
        node = next(h for h in self.nodes if h.name == name)
        self._spawn_in_node(f"slurmd-{name}", node, [SLURMD, "-D", "-f", str(self.conf_path), "-N", name])
        self.slurm("scontrol", "update", f"NodeName={name}", "State=RESUME", check=False)
        _wait_for(self._all_idle, 60, f"{name} did not come back to idle", self.dir / "logs" / "slurmctld.log")

    def stop(self) -> None:
        """Stop every daemon the cluster started (slurmds first, then slurmctld, then munged); safe twice."""
        stop_daemons(self.state)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.login.set_ssh_environment({k: v for k, v in self.login.ssh_environment().items() if k != "SLURM_CONF"})

    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- start ---------------------------------------------------------------------------------------------

    def _start(self) -> None:
        for sub in ("state", "munge", "logs", "cgroup/memory"):
            (self.dir / sub).mkdir(mode=0o755, parents=True)
        for node in self.nodes:  # each node's own temporary folder (TmpFS), as every cluster node has its /tmp
            (self.dir / f"tmp-{node.name}").mkdir()
            os.chmod(self.dir / f"tmp-{node.name}", 0o1777)
        hosts_lines = ["127.0.0.1 localhost"] + [f"{h.address} {h.name}" for h in [self.login, *self.nodes]]
        (self.dir / "hosts").write_text("\n".join(hosts_lines) + "\n")
        key = self.dir / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        self.conf_path.write_text(self._conf())
        (self.dir / "cgroup.conf").write_text(f"CgroupPlugin=cgroup/v1\nCgroupMountpoint={self.dir}/cgroup\n"
                                              "ConstrainRAMSpace=yes\nConstrainSwapSpace=no\n")
        os.chmod(self.dir / "munge", 0o755)
        self._spawn("munged", [MUNGED, "--foreground", "--force", f"--key-file={key}",
                               f"--socket={self.munge_socket}", f"--pid-file={self.dir}/munge/munged.pid",
                               f"--log-file={self.dir}/logs/munged.log", f"--seed-file={self.dir}/munge/seed"])
        _wait_for(lambda: self.munge_socket.exists(), 10, "munged did not create its socket",
                  self.dir / "logs" / "munged.log")
        self._spawn_in_node("slurmctld", self.login, [SLURMCTLD, "-D", "-i", "-f", str(self.conf_path)])
        _wait_for(lambda: self.slurm("scontrol", "ping", check=False).returncode == 0, 20,
                  "slurmctld does not answer", self.dir / "logs" / "slurmctld.log")
        for node in self.nodes:
            self._spawn_in_node(f"slurmd-{node.name}", node,
                                [SLURMD, "-D", "-f", str(self.conf_path), "-N", node.name])
        _wait_for(self._all_idle, 30, "the compute nodes did not become idle", self.dir / "logs" / "slurmctld.log")
        self.login.update_ssh_environment({"SLURM_CONF": str(self.conf_path)})

    def _all_idle(self) -> bool:
        out = self.slurm("sinfo", "-h", "-N", "-p", PARTITION, "-o", "%N %T", check=False).stdout.split("\n")
        states = dict(line.split() for line in out if line.strip())
        return all(states.get(n, "").rstrip("*") == "idle" for n in self.node_names)

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.dir / "logs" / f"{name}.out", "ab")  # noqa: SIM115 - the daemon keeps it
        with log:
            proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                    start_new_session=True, env=self.env)
        self.state.pids[name] = [proc.pid, start_time(proc.pid)]
        self._save()

    def _spawn_in_node(self, name: str, host: TestHost, argv: list[str]) -> None:
        memory = ""
        if self.memory_enforced:
            node_memory_cgroup(host.name).mkdir(exist_ok=True)
            memory = str(node_memory_cgroup(host.name))
            if memory not in self.state.cgroups:
                self.state.cgroups.append(memory)
        self._spawn(name, [*host.nsenter(), "unshare", "--uts", "--mount", "--propagation", "private",
                           "sh", "-c", _IN_NODE_NS, host.name, str(self.dir / "hosts"), memory,
                           str(self.dir / "cgroup" / "memory"), *argv])

    def _save(self) -> None:
        tmp = self.dir / "state.json.tmp"
        tmp.write_text(json.dumps(asdict(self.state)))
        os.replace(tmp, self.dir / "state.json")

    def _conf(self) -> str:
        d = self.dir
        nodes = "\n".join(f"NodeName={h.name} NodeAddr={h.address} CPUs={self.cpus} RealMemory={NODE_MEMORY_MB} "
                          "State=UNKNOWN" for h in self.nodes)
        names = ",".join(self.node_names)
        return f"""# ddpctl test-bed cluster {self.bed.idx}
ClusterName=ddpctl{self.bed.idx}
SlurmctldHost={self.login.name}({self.login.address})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket},cred_expire=10
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool-%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/logs/slurmctld.log
SlurmdLogFile={d}/logs/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin={"task/cgroup" if self.memory_enforced else "task/none"}
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={d}/logs/jobcomp.log
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
DefMemPerCPU={NODE_MEMORY_MB // self.cpus}
MpiDefault=none
TmpFS={d}/tmp-%n
ReturnToService=2
MinJobAge=3600
SlurmdTimeout=10
SlurmctldTimeout=10
InactiveLimit=0
KillWait=10
OverTimeLimit=0
SchedulerParameters=sched_interval=2,bf_interval=2
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
{nodes}
PartitionName={PARTITION} Nodes={names} Default=YES MaxTime=INFINITE State=UP PriorityTier=2
PartitionName={SHORT_PARTITION} Nodes={names} MaxTime=1 State=UP PriorityTier=2
PartitionName={DOWN_PARTITION} Nodes={names} MaxTime=INFINITE State=DOWN PriorityTier=2
PartitionName={LOW_PARTITION} Nodes={names} MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=CANCEL
PartitionName={HIGH_PARTITION} Nodes={names} MaxTime=INFINITE State=UP PriorityTier=2
"""


def stop_daemons(state: ClusterState) -> None:
    """Kill the recorded daemons (only while their pid still names the process started), slurmds first."""
    order = sorted(state.pids, key=lambda n: (n == "munged", n == "slurmctld"))
    for name in order:
        pid, started = state.pids[name]
        if isinstance(pid, int) and started is not None and start_time(pid) == started:
            kill_and_wait([pid], timeout=10)
    for cgroup in state.cgroups:  # each node's memory cgroup folder (task/cgroup's job folders inside it)
        remove_cgroup(Path(cgroup))
    # munged may have forked before --foreground took effect in old versions; its pid file names it.
    pid = read_pid(Path(state.dir, "munge", "munged.pid"))
    if pid and Path(f"/proc/{pid}/exe").exists() and os.readlink(f"/proc/{pid}/exe") == MUNGED:
        kill_and_wait([pid])


def node_memory_cgroup(node: str) -> Path:
    """The node's own folder in the memory hierarchy: slurmd sees it as its cgroup root, so nodes (and clusters)
    never share task/cgroup's `slurm/uid_U/job_J` folders."""
    return MEMORY_CGROUP / f"ddpctl-slurm-{node}"


def remove_cgroup(path: Path) -> None:
    """rmdir a cgroup folder and those below it (a cgroup is removed with rmdir once no process is in it)."""
    if not path.is_dir():
        return
    for sub in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            sub.rmdir()
    with contextlib.suppress(OSError):
        path.rmdir()


def _wait_for(ready: Callable[[], bool], timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            text = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
            raise TestbedError(f"{what} within {timeout:.0f} s; {log.name}:\n{text}")
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.slurm_cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="start a test bed and a Slurm cluster on it, living until `stop`")
    start.add_argument("--nodes", type=int, default=2, help="compute nodes (default 2)")
    sub.add_parser("stop", help="stop every cluster started by hand, and its test bed")
    args = parser.parse_args(argv)
    if args.command == "start":
        bed = Testbed("ddpslm", n_hosts=args.nodes + 1, persistent=True, host_python=True)
        try:
            cluster = SlurmCluster(bed)
        except BaseException:
            bed.stop()
            raise
        print(f"Slurm cluster on test bed {bed.idx}: login {cluster.login.spec}, nodes {', '.join(cluster.node_names)}")
        print(f"SLURM_CONF={cluster.conf_path}")
        print(f"try: ssh -i {bed.client_key_path} -o UserKnownHostsFile={bed.known_hosts_path} "
              f"{cluster.login.user}@{cluster.login.address} sinfo")
        return 0
    from infra.testbed import list_beds, stop_bed_dir
    for bed_dir, state in list_beds():
        if state is None or state.prefix != "ddpslm" or state.owner_pid is not None:
            continue
        try:
            cstate = ClusterState(**json.loads((bed_dir / "slurm" / "state.json").read_text()))
            stop_daemons(cstate)
        except (OSError, ValueError, TypeError):
            pass
        stop_bed_dir(bed_dir)
        print(f"stopped the Slurm cluster on test bed {state.idx}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
