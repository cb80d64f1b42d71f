"""A `--no-x` form exists only where it can undo something: a flag a config file (--config, --from) may set.
Flags that only shape this invocation (--quiet, --json, --dry-run, --no-probe) have no negative spelling."""

from __future__ import annotations

import subprocess
import sys

import pytest

from launcher.cli.options import LAUNCH_BLOCKS
from tests.testbed_fixtures import REPO

ONLY_THIS_INVOCATION = sorted(o.flag if o.name != "json_out" else "--json" for block in LAUNCH_BLOCKS for o in block
                              if o.type is bool and not o.in_config)
KEPT_IN_CONFIG = sorted(o.flag for block in LAUNCH_BLOCKS for o in block
                        if o.type is bool and o.in_config and o.name != "down")


def up_help() -> str:
    result = subprocess.run([sys.executable, "-m", "launcher", "up", "--help-all"], cwd=REPO, capture_output=True,
                            text=True, timeout=120, env={"COLUMNS": "300", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_families_are_not_empty() -> None:
    assert "--quiet" in ONLY_THIS_INVOCATION and "--detach" in KEPT_IN_CONFIG


@pytest.mark.parametrize("flag", ONLY_THIS_INVOCATION)
def test_a_flag_of_this_invocation_has_no_negative_form(flag: str) -> None:
    result = subprocess.run([sys.executable, "-m", "launcher", "up", "--no-" + flag[2:],
                             "--dry-run"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_flag_a_config_may_set_can_be_undone() -> None:
    shown = up_help()
    for flag in KEPT_IN_CONFIG:
        assert "--no-" + flag[2:] in shown, flag
