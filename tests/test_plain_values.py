"""Option values read without pydantic (launcher/cli/plain_values.py) are what typer's own reading gives: the same
value, or the same refusal, for each type the launcher's options have; and `up` imports no pydantic (nor the other
commands' modules)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import launcher
from launcher.cli.plain_values import plain_bool, plain_float, plain_int, plain_str

pydantic = pytest.importorskip("pydantic")

TEXTS = ["3", " 3 ", "+3", "-3", "1_000", "3.0", "3.", "3.5", ".5", "1e3", "1E-3", "inf", "-Infinity", "nan",
         "\u0663", "0x10", "", "  ", "3 4", "1__0", "_1", "1_", "abc", "true", "Yes", "off", "F", "2"]
VALUES: list[Any] = [*TEXTS, 3, 3.0, 2.5, True, False, 0]


def typers(kind: type, value: Any) -> Any:
    """What typer 0.29's reading (a pydantic TypeAdapter in lax mode) gives: the value, or the error's message."""
    try:
        return pydantic.TypeAdapter(kind).validate_python(value)
    except pydantic.ValidationError as e:
        return "error: " + e.errors()[0]["msg"]


def ours(read: Any, value: Any) -> Any:
    try:
        return read(value)
    except ValueError as e:
        return f"error: {e}"


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize(("kind", "read"), [(int, plain_int), (float, plain_float)])
def test_numbers_are_read_as_typer_reads_them(kind: type, read: Any) -> None:
    for value in VALUES:
        assert same(ours(read, value), typers(kind, value)), (kind, value, ours(read, value), typers(kind, value))


def test_flags_given_as_text_are_read_as_typer_reads_them() -> None:
    """typer strips a flag's text and reads "" as False before pydantic reads the rest."""
    for value in [*VALUES, " yes ", "ON"]:
        expected = False if isinstance(value, str) and not value.strip() else typers(
            bool, value.strip() if isinstance(value, str) else value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            continue  # a flag's value is a bool or text, never a number
        assert same(ours(plain_bool, value), expected), (value, ours(plain_bool, value), expected)
    assert ours(plain_str, "x y") == "x y" and ours(plain_str, 3).startswith("error")


@pytest.mark.integration
def test_up_reads_its_options_without_importing_pydantic_and_refuses_as_before(tmp_path: Path) -> None:
    checkout = Path(launcher.__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    code = ("import sys, json\nfrom launcher.cli.app import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    code = e.code\nelse:\n    code = 0\n"
            "print(json.dumps([code, 'pydantic' in sys.modules, 'launcher.cli.report_sweep' in sys.modules]), "
            "file=sys.stderr)\n")

    def up(*args: str) -> tuple[list[Any], str]:
        done = subprocess.run([sys.executable, "-c", code, "up", "--host", "h", "--no-probe", "--dry-run", "--json",
                               "--runs-dir", str(tmp_path), *args], capture_output=True, text=True, env=env,
                              timeout=60, cwd=tmp_path, stdin=subprocess.DEVNULL)
        return json.loads(done.stderr.strip().splitlines()[-1]), done.stdout + done.stderr

    (status, imported, others), out = up("--epochs", " 4 ", "--lr", "1e-3", "--identity-file", str(tmp_path / "k"))
    assert (status, imported, others) == (0, False, False), out  # nor the modules of the other commands
    plan = json.loads(out[:out.rindex("}") + 1])
    assert plan["spec"]["epochs"] == 4 and plan["spec"]["lr"] == 0.001
    (status, *_), out = up("--epochs", "3.5")
    assert status != 0 and ("Invalid value for '--epochs': Input should be a valid integer, unable to parse string "
                            "as an integer") in out
    (status, *_), out = up("--lr", "fast")
    assert status != 0 and "Invalid value for '--lr': Input should be a valid number" in out
