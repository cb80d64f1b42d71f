"""Shared fixtures: the multi-host test bed (see tests/testbed_fixtures.py); a run directory with the stop signals
caught (tests/interruption_fixtures.py); the end-of-session check that
fails the suite when a mount, namespace, container or process it made is left behind (tests/session_leaks.py).

No test may wait on the real internet: `up --provider vast` reads its image's labels from the image's registry
(launcher/places/vast/registry_api.py), and the tests' images name Docker Hub. HTTPS here goes to a proxy
that refuses at once, so that read falls back in milliseconds on any machine, with or without a route out; the
registry tests use their own stand-in over plain HTTP on 127.0.0.1, which no proxy touches. The suite's own
set-up is not cut off by it: what the tests install comes before (`infra/setup.sh --test` downloads the Docker
base image's wheels into a cache that infra/base_image.sh builds from; tests/test_base_image_offline.py shows it).

A suite started with a stop signal ignored (SIGHUP under `nohup`; SIGINT for a background job of a script, or a
runner that ignores them) would hand the ignore on to every ddpctl it starts, and ddpctl keeps an inherited
ignore, as `nohup` and the shell ask: the tests of Ctrl-C and of a terminal closing need ddpctl started as a
terminal starts it. An ignored SIGINT gets Python's usual handler back; an ignored SIGHUP or SIGTERM becomes a
handler that does nothing, so the suite itself still outlives them. A handler, unlike an ignore, is not inherited
by the programs the suite starts.

The suite's runs share this machine's cores (several workers, each test-bed host a namespace on the same cores):
every torch process gets one intra-op thread unless a test sets its own, as torchrun itself sets when it starts
several processes on a node. A rank's spare thread would only spin against the other workers' ranks (a 1-rank
training measured at 5.7 s of CPU with 2 threads, 3.7 s with 1, both cores loaded). The trainer's own default,
the node's cores shared out, is what tests/test_strategies_units.py checks."""

import os
import signal

from tests.faults.fault_support import stop_leftover_ups  # noqa: F401
from tests.interruption_fixtures import run_dir  # noqa: F401
from tests.network_isolation import isolate_from_internet
from tests.session_leaks import pytest_sessionfinish, pytest_sessionstart, pytest_testnodedown  # noqa: F401
from tests.slurm_fixtures import slurm_cluster  # noqa: F401
from tests.testbed_fixtures import testbed, two_hosts  # noqa: F401
from tests.tiers import _unit_tier_guard, pytest_collection_modifyitems  # noqa: F401

pytest_plugins = ["tests.worker_groups"]  # which tests share one xdist worker (`-n N --dist loadgroup`)

isolate_from_internet()
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _outlive(_signum: int, _frame: object) -> None:
    """SIGHUP or SIGTERM for a suite started ignoring them: nothing, as before, but not passed on."""


for _signal, _handler in ((signal.SIGINT, signal.default_int_handler), (signal.SIGHUP, _outlive),
                          (signal.SIGTERM, _outlive)):
    if signal.getsignal(_signal) == signal.SIG_IGN:
        signal.signal(_signal, _handler)
