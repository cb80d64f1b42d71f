"""The launcher's shape, checked: no import cycles, modules one can read in a sitting, a thin command layer."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CYCLES_TOOL = ROOT.parent / "shared" / "tools" / "import_cycles.py"
MAX_MODULE_LINES = 400
MAX_COMMAND_FUNCTION_LINES = 60


def test_no_import_cycles_in_launcher_or_trainer():
    assert CYCLES_TOOL.is_file(), f"{CYCLES_TOOL} is missing: the team's import-cycle tool lives in ../shared/tools"
    result = subprocess.run([sys.executable, str(CYCLES_TOOL), "launcher", "trainer"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no import cycles" in result.stdout


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
