"""tests/worker_groups.py on a real `pytest -n N --dist loadgroup` session: the tests of a module that share a
module-scoped fixture run on one worker, which makes the fixture once; the groups are handed out in the order the
plugin sets, not by their number of tests. Its table of long groups names groups and tests that exist."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from tests.worker_groups import FIRST_IN_TIER, KNOWN_SECONDS

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

@pytest.mark.parametrize("n", range(3))
def test_asks_for_it_by_name(request, n):
    request.getfixturevalue("made_once")
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
    assert len(made) == 1 and read == set(made), lines  # made once, read on that worker only, also when asked by name
    assert len([1 for kind, _ in lines if kind == "read"]) == 9
    assert len([1 for kind, _ in lines if kind == "free"]) == 6
    assert {w for _, w in lines} == {"gw0", "gw1"}, lines  # both workers had work


def run_inner(project: Path, tmp_path: Path, workers: int) -> tuple[subprocess.CompletedProcess[str], list[list[str]]]:
    record = tmp_path / "record"
    env = {**os.environ, "PYTHONPATH": str(REPO), "RECORD": str(record), "DDPCTL_SKIP_LEAK_CHECK": "1"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                             "-n", str(workers), "--dist", "loadgroup", f"--basetemp={tmp_path / 'basetemp'}"],
                            cwd=project, env=env, capture_output=True, text=True, timeout=300)
    return result, [line.split() for line in record.read_text().splitlines()] if record.exists() else []


def test_groups_are_handed_out_in_the_plugins_order_not_by_their_number_of_tests(tmp_path: Path) -> None:
    """a_free.py's three tests are collected before b_shared.py's group of nine: in that order they run (xdist's
    own reordering would run the larger group first); an e2e test collected last runs before both (its tier)."""
    project = tmp_path / "inner"
    project.mkdir()
    (project / "conftest.py").write_text('pytest_plugins = ["tests.worker_groups"]\n')
    (project / "test_a_free.py").write_text(FREE.replace("range(6)", "range(3)"))
    (project / "test_b_shared.py").write_text(SHARED.replace("time.sleep(0.3)", "pass"))
    (project / "test_c_e2e.py").write_text(FREE.replace("range(6)", "range(1)").replace('"free "', '"e2e "').replace(
        '@pytest.mark.parametrize("n", range(1))', '@pytest.mark.e2e\n@pytest.mark.parametrize("n", range(1))'))
    result, lines = run_inner(project, tmp_path, 1)
    assert result.returncode == 0, result.stdout + result.stderr
    kinds = [kind for kind, _ in lines]
    assert kinds == ["e2e"] + ["free"] * 3 + ["made"] + ["read"] * 9, kinds


def test_each_long_group_or_test_named_still_exists() -> None:
    """A renamed module or test would leave its figure behind unnoticed (it only orders; this keeps it true)."""
    tests = REPO / "tests"
    for key in [*KNOWN_SECONDS, *FIRST_IN_TIER]:
        if key.startswith("module:"):
            assert (tests / f"{key.removeprefix('module:')}.py").is_file(), key
        else:
            path, _, name = key.partition("::")
            assert (REPO / path).is_file(), key
            if name:
                defined = {node.name for node in ast.walk(ast.parse((REPO / path).read_text()))
                           if isinstance(node, ast.FunctionDef)}
                assert name in defined, key

