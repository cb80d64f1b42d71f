"""Every `--option` that a message of ddpctl names (between backticks or in a sentence: the advice a user copies)
is an option of some ddpctl command, or one of the other programs' options listed here with the program that has
it: advice that names an option nobody has (`--keep-snapshots`, the trainer's, given to `up`) is a dead end. Also:
where the advice is "free some space there", the place is a disk (not /proc)."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest

from launcher.cli.app import _register_commands, app
from launcher.errors import DdpctlError
from launcher.planning.preflight import check_local_disk, disk_shortfall
from launcher.spec.run_spec import RunSpec

LAUNCHER = Path(__file__).resolve().parent.parent / "launcher"

# Options of other programs that ddpctl's lines name as theirs (the program is named in the same span or line).
OTHER_PROGRAMS = {
    "--array": "sbatch", "--parsable": "sbatch", "--test-only": "sbatch", "--wait": "sbatch", "--wrap": "sbatch",
    "--signal": "sbatch/scancel", "--env-file": "docker run", "--standalone": "torchrun", "--log-dir": "torchrun",
    "--redirects": "torchrun", "--local-addr": "torchrun", "--nproc": "torchrun's --nproc-per-node, mistyped",
    "--mem": "sbatch", "--gpus-per-node": "sbatch", "--ntasks-per-node": "srun", "--kill-on-bad-exit": "srun",
    "--user": "docker run", "--help": "every command's own (click adds it)", "--cpus-per-task": "sbatch",
    "--gres": "sbatch", "--logdir": "tensorboard", "--no-same-owner": "tar", "--mpi": "srun",
}
# An option typed after `=` is a value (`--trainer-arg=--keep-snapshots=1`: the trainer's, passed through).
OPTION_IN_SPAN = re.compile(r"(?<![\w=-])(--[a-z][a-z0-9-]*)")


def ddpctl_options() -> set[str]:
    """Every spelling of every option of every ddpctl command (typer's own click: walked by attribute)."""
    _register_commands()
    from typer.main import get_command

    found: set[str] = set()
    pending: list[Any] = [get_command(app)]
    while pending:
        command = pending.pop()
        for param in command.params:
            found.update([*param.opts, *param.secondary_opts])
        pending += list(getattr(command, "commands", {}).values())
    return found


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            ids.add(id(body[0].value))
    return ids


def message_texts(path: Path) -> list[str]:
    """The string literals of a module that are not docstrings, an f-string's fields as `X`."""
    tree = ast.parse(path.read_text())
    skip = _docstrings(tree)
    texts, inside = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            texts.append("".join(v.value if isinstance(v, ast.Constant) else "X" for v in node.values))
            inside.update(id(v) for v in node.values)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip | inside:
            texts.append(node.value)
    return texts


def advised_options() -> dict[str, set[str]]:
    """option -> the modules whose messages name it (between backticks, or in a sentence)."""
    found: dict[str, set[str]] = {}
    for path in sorted(LAUNCHER.rglob("*.py")):
        for text in message_texts(path):
            # Between backticks, or in a sentence (five words or more: argv lists are single words).
            spans = re.findall(r"`([^`\n]+)`", text) + ([text] if len(text.split()) >= 5 else [])
            for option in (o for span in spans for o in OPTION_IN_SPAN.findall(span)):
                found.setdefault(option, set()).add(str(path.relative_to(LAUNCHER.parent)))
    return found


def test_every_option_named_in_backticks_is_one_of_a_ddpctl_command() -> None:
    options = ddpctl_options()
    advised = advised_options()
    assert len(advised) > 30  # the scan reads the messages: they name dozens of options
    unknown = {option: sorted(where) for option, where in advised.items()
               if option not in options and option not in OTHER_PROGRAMS}
    assert unknown == {}


def test_the_scan_finds_an_option_nobody_has(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('"""`--in-a-docstring`."""\nX = 1\nraise E(f"keep fewer (`--keep-snapshots {X}`), or '
                      '`--trainer-arg=--passed-through=1`")\n')
    spans = [s for text in message_texts(module) for s in re.findall(r"`([^`\n]+)`", text)]
    assert [o for s in spans for o in OPTION_IN_SPAN.findall(s)] == ["--keep-snapshots", "--trainer-arg"]


@pytest.mark.parametrize("where", ["/proc", "/sys"])
def test_a_runs_dir_on_a_kernel_file_system_is_named_as_such_not_as_full(where: str) -> None:
    with pytest.raises(DdpctlError) as refused:
        check_local_disk(RunSpec(run_id="r", epochs=1), Path(where) / "x" / "r")
    line = str(refused.value)
    assert line.startswith(f"--runs-dir {where}/x: {where} is a kernel file system") and "free some space" not in line


def test_the_disk_advice_names_how_to_keep_fewer_snapshots() -> None:
    line = disk_shortfall(RunSpec(run_id="r", epochs=4), 0, "/data")
    assert "`--trainer-arg=--keep-snapshots=1`" in line and "--save-every" in line
