"""Shared fixtures: the multi-host test bed (see tests/testbed_fixtures.py)."""

from tests.testbed_fixtures import testbed  # noqa: F401
