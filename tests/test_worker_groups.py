"""tests/worker_groups.py on a real `pytest -n 2 --dist loadgroup` session: the tests of a module that share a
module-scoped fixture run on one worker, which makes the fixture once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

SHARED = '''
import os, time
import pytest

@pytest.fixture(scope="module")
def made_once():
    with open(os.environ["RECORD"], "a") as f:
        f.write("made " + os.environ["PYTEST_XDIST_WORKER"] + "\\n")
    return 1

@pytest.mark.parametrize("n", range(6))
def test_reads_it(made_once, n):
    with open(os.environ["RECORD"], "a") as f:
        f.write("read " + os.environ["PYTEST_XDIST_WORKER"] + "\\n")
    time.sleep(0.3)
'''
FREE = '''
import os, time
import pytest

@pytest.mark.parametrize("n", range(6))
def test_free(n):
    with open(os.environ["RECORD"], "a") as f:
        f.write("free " + os.environ["PYTEST_XDIST_WORKER"] + "\\n")
    time.sleep(0.3)
'''


def test_a_module_fixtures_tests_share_one_worker_and_the_rest_spread(tmp_path: Path) -> None:
    project = tmp_path / "inner"
    project.mkdir()
    (project / "conftest.py").write_text('pytest_plugins = ["tests.worker_groups"]\n')
    (project / "test_shared.py").write_text(SHARED)
    (project / "test_free.py").write_text(FREE)
    record = tmp_path / "record"
    env = {**os.environ, "PYTHONPATH": str(REPO), "RECORD": str(record), "DDPCTL_SKIP_LEAK_CHECK": "1"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                             "-n", "2", "--dist", "loadgroup", f"--basetemp={tmp_path / 'basetemp'}"],
                            cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line.split() for line in record.read_text().splitlines()]
    made = [w for kind, w in lines if kind == "made"]
    read = {w for kind, w in lines if kind == "read"}
    assert len(made) == 1 and read == set(made), lines  # made once, read on that worker only
    assert len([1 for kind, _ in lines if kind == "free"]) == 6
    assert {w for _, w in lines} == {"gw0", "gw1"}, lines  # both workers had work
