"""The real Slurm cluster (infra/slurm_cluster.py) as a session-scoped pytest fixture: started once, on a test
bed of its own (a login host and two compute hosts with this machine's Python), stopped at the session's end.

    @needs_slurm
    def test_x(slurm_cluster):
        slurm_cluster.slurm("sinfo")
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

from infra.slurm_cluster import MUNGED, SLURMCTLD, SLURMD, ClusterState, SlurmCluster, stop_daemons
from infra.testbed import Testbed, cleanup_stale, list_beds, owner_alive
from tests.testbed_fixtures import TESTBED_SKIP_REASON, TESTBED_UNAVAILABLE

SLURM_PREFIX = "ddpslt"
_missing = [tool for tool in (MUNGED, SLURMCTLD, SLURMD) if not os.access(tool, os.X_OK)]
SLURM_UNAVAILABLE = TESTBED_UNAVAILABLE or bool(_missing)
SLURM_SKIP_REASON = (TESTBED_SKIP_REASON if TESTBED_UNAVAILABLE else
                     f"{', '.join(_missing)} missing: bash infra/setup.sh --test installs slurmctld, slurmd, munge")
needs_slurm = pytest.mark.skipif(SLURM_UNAVAILABLE, reason=SLURM_SKIP_REASON)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """slurmctld on a login host (sshd), slurmd on two compute hosts; everything removed at the session's end."""
    if SLURM_UNAVAILABLE:
        pytest.skip(SLURM_SKIP_REASON)
    stop_stale_clusters()
    cleanup_stale(SLURM_PREFIX)
    bed = Testbed(SLURM_PREFIX, n_hosts=3, host_python=True)
    try:
        with SlurmCluster(bed) as cluster:
            yield cluster
    finally:
        bed.stop()


def stop_stale_clusters() -> None:
    """The daemons and memory cgroups of clusters whose test session was killed (their beds' owner is gone):
    removing a bed's namespaces does not end the processes started in them."""
    for bed_dir, state in list_beds():
        if state is None or state.prefix != SLURM_PREFIX or owner_alive(state):
            continue
        try:
            stop_daemons(ClusterState(**json.loads((bed_dir / "slurm" / "state.json").read_text())))
        except (OSError, ValueError, TypeError):
            continue
