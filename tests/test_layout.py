"""The launcher's shape, checked: layers that point one way and no import cycles (import-linter, every import
counted), modules one can read in a sitting, a thin command layer."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
MAX_MODULE_LINES = 400
MAX_COMMAND_FUNCTION_LINES = 60


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """The project's import check (import-linter, contracts in pyproject.toml) run on the tree at `root`."""
    return subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command as c; c()",
                           "--no-cache"],  # the contracts: root/pyproject.toml
                          cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True,
                          timeout=120)


def test_the_layers_and_acyclic_packages_hold():
    """Every import counts (in functions and under TYPE_CHECKING too), with no exceptions list."""
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 kept, 0 broken" in result.stdout
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    assert config["exclude_type_checking_imports"] is False
    assert all("ignore_imports" not in contract for contract in config["contracts"])


UPWARD_IMPORTS = {  # module to edit, text appended to it, the import the check must name
    "in a function": ("launcher/spec/run_spec.py",
                      "\n\ndef _upward() -> None:\n    from launcher.cli import app  # noqa: F401\n",
                      "launcher.spec.run_spec -> launcher.cli.app"),
    "under TYPE_CHECKING": ("launcher/transport/ssh.py",
                            "\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                            "    from launcher.execute.up import run_on_provider  # noqa: F401\n",
                            "launcher.transport.ssh -> launcher.execute.up"),
    "a cycle in a function": ("trainer/files.py",
                              "\n\ndef _cycle() -> None:\n    import trainer.records  # noqa: F401\n",
                              "- .records -> .files"),
}


@pytest.mark.parametrize("case", ["unchanged", *UPWARD_IMPORTS])
def test_the_check_fails_on_an_upward_import_in_a_scratch_copy(tmp_path: Path, case: str):
    """A copy of the tree with one import added from a lower layer to a higher one (inside a function, or only
    for type checking), or one that closes a cycle, fails the check naming it; the unchanged copy passes."""
    for package in ("launcher", "trainer"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    if case != "unchanged":
        module, text, named = UPWARD_IMPORTS[case]
        with open(tmp_path / module, "a", encoding="utf-8") as edited:
            edited.write(text)
    result = lint_imports(tmp_path)
    if case == "unchanged":
        assert result.returncode == 0, result.stdout + result.stderr
        return
    assert result.returncode != 0, result.stdout
    assert "BROKEN" in result.stdout and named in result.stdout, result.stdout


def test_no_module_over_the_line_limit():
    too_long = {str(p.relative_to(ROOT)): n for package in ("launcher", "trainer")
                for p in sorted((ROOT / package).rglob("*.py"))
                if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert too_long == {}, f"modules over {MAX_MODULE_LINES} lines: split them by concern"


def test_command_layer_functions_are_short():
    """Bodies are counted (docstring left out): a command's signature is its option declarations."""
    long_functions = {}
    for path in sorted((ROOT / "launcher" / "cli").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                body = node.body[1:] if ast.get_docstring(node) and len(node.body) > 1 else node.body
                length = (node.end_lineno or node.lineno) - body[0].lineno + 1
                if length > MAX_COMMAND_FUNCTION_LINES:
                    long_functions[f"{path.relative_to(ROOT)}::{node.name}"] = length
    assert long_functions == {}, "command functions declare options and call the core: move the logic out"


def test_every_seam_is_a_package():
    """A newcomer reading only the tree finds each concern in a folder named for it."""
    seams = {"spec", "planning", "providers", "runtimes", "execute", "transport", "results", "cli"}
    packages = {p.parent.name for p in (ROOT / "launcher").glob("*/__init__.py")}
    assert seams <= packages
    flat = sorted(p.name for p in (ROOT / "launcher").glob("*.py"))
    assert flat == ["__init__.py", "__main__.py", "errors.py"]
