"""The compiled host programs kept on the host (launcher/remote/program.py's _LOADER): a state poll, as a host runs
it (`python -S -c STDIN_LOADER REQUEST`, the program on standard input, HOME the user's), compiles the node program
once and then loads what it kept; a damaged or foreign file is compiled anew, a home that cannot be written changes
nothing but the cost, a host where ddpctl has no ~/.ddpctl yet (a probe's, a refused run's) and a program not made
to keep (the probe's) write nothing, and a changed module is never run from an older compilation. A poll imports
none of the modules the node program imports only where it needs them (launcher/remote/__init__.py's
LAZY_IMPORTS)."""

from __future__ import annotations

import ast
import json
import marshal
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.remote import attribution, node_report, node_start, node_state, node_stop, proctree
from launcher.remote.program import on_stdin, program
from launcher.runtimes.native import node_program

LAZY = ("subprocess", "shutil", "base64", "typing")


def poll(home: Path, workspace: Path, *python_options: str,
         text: str | None = None) -> subprocess.CompletedProcess[str]:
    """One state poll of `workspace` as the hosts run it (the node program, or `text`), by a user whose home is
    `home`."""
    loader, text = on_stdin(text or node_program())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HOME": str(home)}
    request = json.dumps({"workspace": str(workspace)})
    done = subprocess.run([sys.executable, "-I", "-S", *python_options, *loader, request], input=text,
                          capture_output=True, env=env, timeout=60, check=False)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


def kept_file(home: Path, text: str) -> Path:
    key = ast.literal_eval(next(line for line in text.splitlines() if line.startswith("_KEY = "))[len("_KEY = "):])
    return home / ".ddpctl" / "programs" / f"{sys.implementation.cache_tag}-{key}"


def sources(text: str) -> list[tuple[str, str]]:
    return list(ast.literal_eval(text.split("\n", 1)[0].removeprefix("_SOURCES = ")))


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A host user's home where ddpctl has run before (its ~/.ddpctl is there)."""
    (tmp_path / "home" / ".ddpctl").mkdir(parents=True)
    return tmp_path / "home"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "out").mkdir(parents=True)
    (ws / "exit_code").write_text("0\n")
    return ws


@pytest.mark.integration
def test_the_first_poll_keeps_its_compilation_and_the_next_runs_what_it_kept(home: Path, workspace: Path) -> None:
    first = poll(home, workspace)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["exit_code"] == 0
    kept = kept_file(home, node_program())
    assert kept.is_file() and (kept.parent.stat().st_mode & 0o777) == 0o700
    assert [p.name for p in kept.parent.iterdir()] == [kept.name]  # nothing half-written left beside it

    # What the next poll runs is the kept code, not the sources it was sent: a kept compilation whose node_state
    # answers something else is what answers.
    text = node_program()
    changed = [(name, source.replace('found["now"] = time.time()', 'found["now"] = "from the kept file"')
                if name == "launcher.remote.node_state" else source) for name, source in sources(text)]
    kept.write_bytes(marshal.dumps([compile(source, f"<ddpctl {name}>", "exec") for name, source in changed]))
    second = poll(home, workspace)
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["now"] == "from the kept file"


@pytest.mark.integration
def test_a_poll_imports_none_of_the_lazy_modules(home: Path, workspace: Path) -> None:
    for _ in range(2):  # compiling (the first poll) and loading what was kept (the second)
        done = poll(home, workspace, "-X", "importtime")
        assert done.returncode == 0, done.stderr
        imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line}
        assert "json" in imported and not imported & set(LAZY), sorted(imported & set(LAZY))


@pytest.mark.integration
@pytest.mark.parametrize("damage", ["truncated", "not marshal", "another program", "not a list"])
def test_a_damaged_or_foreign_kept_file_is_compiled_anew_and_replaced(home: Path, workspace: Path, damage: str) -> None:
    kept = kept_file(home, node_program())
    assert poll(home, workspace).returncode == 0
    whole = kept.read_bytes()
    other = [compile(s, f"<ddpctl {n}>", "exec") for n, s in sources(program(node_stop))]  # under this one's name
    kept.write_bytes({"truncated": whole[: len(whole) // 2],
                      "not marshal": b"\x00garbage\xff" * 10,
                      "another program": marshal.dumps(other),
                      "not a list": marshal.dumps({"code": 1})}[damage])
    done = poll(home, workspace)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["exit_code"] == 0
    assert marshal.loads(kept.read_bytes()) == marshal.loads(whole)  # the same code (marshal's bytes may differ)


@pytest.mark.integration
def test_a_home_that_cannot_be_written_costs_a_compilation_and_nothing_else(home: Path, workspace: Path) -> None:
    (home / ".ddpctl" / "programs").write_text("")  # not a folder (this runs as root: modes would not stop it)
    done = poll(home, workspace)
    assert done.returncode == 0 and done.stderr == ""
    assert json.loads(done.stdout)["exit_code"] == 0
    assert (home / ".ddpctl" / "programs").read_text() == "" and os.listdir(home / ".ddpctl") == ["programs"]


@pytest.mark.integration
def test_nothing_is_written_where_ddpctl_has_not_been_nor_by_a_program_not_made_to_keep(tmp_path: Path,
                                                                                         home: Path,
                                                                                         workspace: Path) -> None:
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    done = poll(fresh, workspace)
    assert done.returncode == 0 and json.loads(done.stdout)["exit_code"] == 0
    assert os.listdir(fresh) == []  # no ~/.ddpctl made: a probe or a refused run leaves nothing on a host
    not_kept = program(node_state, proctree, node_report, attribution, node_start, node_stop)  # as the probe's
    done = poll(home, workspace, text=not_kept)
    assert done.returncode == 0 and json.loads(done.stdout)["exit_code"] == 0
    assert os.listdir(home / ".ddpctl") == []


def test_a_changed_module_is_a_new_compilation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = node_program()
    changed = tmp_path / "node_stop.py"
    changed.write_text(Path(str(node_stop.__file__)).read_text() + "\n# changed here\n")
    monkeypatch.setattr(node_stop, "__file__", str(changed))
    after = node_program()
    assert kept_file(tmp_path, after) != kept_file(tmp_path, before)
