"""Shared fixtures: the multi-host test bed (see tests/testbed_fixtures.py); the end-of-session check that
fails the suite when a mount, namespace, container or process it made is left behind (tests/session_leaks.py).

No test may wait on the real internet: `up --provider vast` reads its image's labels from the image's registry
(launcher/providers/vast/registry_api.py), and the tests' images name Docker Hub. HTTPS here goes to a proxy
that refuses at once, so that read falls back in milliseconds on any machine, with or without a route out; the
registry tests use their own stand-in over plain HTTP on 127.0.0.1, which no proxy touches."""

import os

from tests.session_leaks import pytest_sessionfinish, pytest_sessionstart  # noqa: F401
from tests.testbed_fixtures import testbed  # noqa: F401

for _name in ("HTTPS_PROXY", "https_proxy"):
    os.environ[_name] = "http://127.0.0.1:9"  # the discard port: nothing listens, the connection is refused
for _name in ("NO_PROXY", "no_proxy"):
    os.environ[_name] = "127.0.0.1,localhost,::1"  # the stand-ins (Vast's API, a registry) answer on loopback
