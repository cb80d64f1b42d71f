"""Shared fixtures: the multi-host test bed (see tests/testbed_fixtures.py); the end-of-session check that
fails the suite when a mount, namespace, container or process it made is left behind (tests/session_leaks.py)."""

from tests.session_leaks import pytest_sessionfinish, pytest_sessionstart  # noqa: F401
from tests.testbed_fixtures import testbed  # noqa: F401
