"""SSH from node 0 to the other nodes for the length of one MPI job (`--launcher mpirun` on several hosts): mpirun
on node 0 starts the other nodes' ranks over SSH, so node 0 must log in to them.

For the run ddpctl makes a key of its own (ed25519, never used again), authorizes it on every other node (one
`restrict`ed authorized_keys line, marked with the run id) and gives node 0, in its workspace's mpi/ folder (0700):
the private key (0600), an ssh config naming each node by an alias with its address, port and login user, and a
known_hosts file holding exactly the host keys ddpctl itself verified when it connected (HostKeyAlias,
StrictHostKeyChecking yes: nothing is trusted on first sight), and the job's hostfile. `remove` takes it all away
again: the authorized_keys lines on every node and node 0's folder, at the end of the run, after a failure or an
interruption alike.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from launcher.errors import HostError
from launcher.planning.mpi_plan import hostfile_text
from launcher.remote import authorized_keys, source_of
from launcher.spec.launchers import MPI_DIR, MPI_HOST_ALIAS

if TYPE_CHECKING:
    from launcher.planning.plan import RunPlan
    from launcher.results.rundir import RunDir
    from launcher.transport.hostsession import HostSession

# Adds / removes the run's line of ~/.ssh/authorized_keys on a node, under the run's python: a fixed program, the
# line an argument (launcher/remote/authorized_keys.py).
AUTHORIZED_KEYS_SCRIPT = source_of(authorized_keys)


class MpiAccess:
    """Node 0's SSH access to the other nodes for one run; `remove()` undoes it (safe to call twice)."""

    def __init__(self, session: HostSession, plan: RunPlan, run_dir: RunDir) -> None:
        self.session, self.plan, self.run_dir = session, plan, run_dir
        self.python = plan.spec.python  # the probe ran it on every node
        self.marker = f"ddpctl-mpi-{plan.spec.run_id}"
        self.key_line = ""
        self.authorized: list[int] = []
        self.folder = f"{plan.nodes[0].workspace}/{MPI_DIR}"
        self.written = False

    def set_up(self) -> None:
        key = Ed25519PrivateKey.generate()
        private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                    serialization.NoEncryption())
        public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        self.key_line = f"restrict {public.decode()} {self.marker}"
        for node in self.plan.nodes[1:]:
            result = self.session.conn(node.index).run([self.python, "-c", AUTHORIZED_KEYS_SCRIPT, "add",
                                                        self.key_line], timeout=30)
            if result.exit_code != 0:
                raise HostError(self.session.label_of(node.index), "could not authorize the run's MPI key in "
                                f"~/.ssh/authorized_keys: {(result.stderr or result.stdout).strip()[:200]}")
            self.authorized.append(node.index)
        home0 = self.plan.node_facts[0].home if self.plan.node_facts else "~"
        files = {"id_ed25519": private, "ssh_config": self._ssh_config(f"{home0}/{self.folder}").encode(),
                 "known_hosts": self._known_hosts().encode(),
                 "hostfile": hostfile_text(self.plan.nodes, self.plan.spec.nproc_per_node).encode()}
        sftp = self.session.conn(0).sftp
        self.written = True
        try:
            sftp.mkdir(self.folder, 0o700)
            for name, data in files.items():
                with sftp.open(f"{self.folder}/{name}", "wb") as f:
                    f.chmod(0o600)
                    f.write(data)
        except OSError as e:
            raise HostError(self.session.label_of(0), f"could not write the run's MPI access files into "
                            f"{self.folder}: {e}") from e
        self.run_dir.event("mpi_access", key=self.marker, nodes=self.authorized,
                           pinned=[MPI_HOST_ALIAS.format(i) for i in self.authorized])

    def _ssh_config(self, folder: str) -> str:
        blocks = []
        for node in self.plan.nodes[1:]:
            target = self.session.targets[node.index]
            alias = MPI_HOST_ALIAS.format(node.index)
            blocks.append(f"Host {alias}\n  HostName {node.host.address or target.hostname}\n  Port {target.port}\n"
                          f"  User {target.user}\n  IdentityFile {folder}/id_ed25519\n  IdentitiesOnly yes\n"
                          f"  UserKnownHostsFile {folder}/known_hosts\n  GlobalKnownHostsFile /dev/null\n"
                          f"  HostKeyAlias {alias}\n  StrictHostKeyChecking yes\n  BatchMode yes\n"
                          "  ForwardAgent no\n  ProxyCommand none\n  ProxyJump none\n")
        return "".join(blocks)

    def _known_hosts(self) -> str:
        """Each other node's host key as ddpctl's own connection verified it, under the node's alias."""
        lines = []
        for node in self.plan.nodes[1:]:
            key = self.session.conn(node.index).transport.get_remote_server_key()
            lines.append(f"{MPI_HOST_ALIAS.format(node.index)} {key.get_name()} {key.get_base64()}\n")
        return "".join(lines)

    def remove(self) -> None:
        """Take the key out of every node's authorized_keys and delete node 0's folder; a host that cannot be
        reached is named in an event (`mpi_access_left`), never silently skipped."""
        left = []
        for index in list(self.authorized):
            try:
                result = self.session.conn(index).run([self.python, "-c", AUTHORIZED_KEYS_SCRIPT, "remove",
                                                       self.marker, self.key_line], timeout=30)
                if result.exit_code == 0:
                    self.authorized.remove(index)
                    continue
                said = (result.stderr or result.stdout).strip()[:120]
                left.append(f"node {index}: {said or 'exit ' + str(result.exit_code)}")
            except Exception as e:  # noqa: BLE001 - every node is tried; what is left is said
                left.append(f"node {index}: {e}")
        if self.written:
            try:
                result = self.session.conn(0).run(["rm", "-rf", "--", self.folder], timeout=30)
                self.written = result.exit_code != 0
                if self.written:
                    left.append(f"node 0: {shlex.quote(self.folder)} not removed")
            except Exception as e:  # noqa: BLE001
                left.append(f"node 0: {e}")
        self.run_dir.event("mpi_access_removed" if not left else "mpi_access_left", key=self.marker, left=left)
