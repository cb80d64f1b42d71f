"""The suite's cut from the internet (tests/conftest.py applies it when the session starts): HTTPS goes to a proxy
that refuses at once. What the environment said before, for a test that must act as set-up does, before the cut."""

from __future__ import annotations

import json
import os

REFUSING_PROXY = "http://127.0.0.1:9"  # the discard port: nothing listens, the connection is refused
PROXY_NAMES = ("HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy")
# What the settings were, handed to the processes the suite starts: a pytest-xdist worker inherits the
# controller's environment, already cut, and must not take the cut for what came before it.
BEFORE_VARIABLE = "DDPCTL_TEST_PROXY_BEFORE_ISOLATION"
before_isolation: dict[str, str | None] = {}


def isolate_from_internet() -> None:
    """HTTPS through the refusing proxy; loopback (the stand-ins: Vast's API, a registry) straight."""
    if not before_isolation:
        inherited = os.environ.get(BEFORE_VARIABLE)
        before_isolation.update(json.loads(inherited) if inherited is not None
                                else {name: os.environ.get(name) for name in PROXY_NAMES})
        os.environ[BEFORE_VARIABLE] = json.dumps(before_isolation)
    for name in ("HTTPS_PROXY", "https_proxy"):
        os.environ[name] = REFUSING_PROXY
    for name in ("NO_PROXY", "no_proxy"):
        os.environ[name] = "127.0.0.1,localhost,::1"


def environment_before_isolation() -> dict[str, str]:
    """This process's environment with the proxy settings as they were before the suite isolated itself."""
    env = dict(os.environ)
    env.pop(BEFORE_VARIABLE, None)
    for name, value in before_isolation.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env
