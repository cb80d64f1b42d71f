"""The places seam holds (issue: one seam for every place a run can go): a place is one folder under
launcher/places/; outside launcher/places/ no code compares a provider's name, and outside a place's folder only the
registry imports it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from launcher.cli.launch import check_options_fit
from launcher.cli.options import flag_of
from launcher.errors import SpecError
from launcher.places.base import Place
from launcher.places.registry import PLACES
from launcher.spec.hosts import parse_hosts

LAUNCHER = Path(__file__).resolve().parent.parent / "launcher"
# A place is one folder under launcher/places/ (its own module is the folder's __init__.py); the interface and the
# registry sit beside them.
PLACE_FOLDERS = sorted(p.name for p in (LAUNCHER / "places").iterdir() if (p / "__init__.py").is_file())
VAST_OR_SLURM = ("launcher.places.vast", "launcher.places.slurm")
# The one module outside the places' folders that names them: the table of places. The command line asks it (for
# the options and for Vast.ai's own commands).
IMPORTING_A_PLACE = {"places/registry.py"}


def _outside(folders: tuple[str, ...]) -> list[Path]:
    return sorted(path for path in LAUNCHER.rglob("*.py")
                  if not any(path.relative_to(LAUNCHER).as_posix().startswith(f + "/") for f in folders))


def _outside_places() -> list[Path]:
    return _outside(("places",))


def compares_a_place_name(tree: ast.AST) -> list[int]:
    """The lines of `tree` that compare something with a place's name (==, !=, in, not in a literal naming one)."""
    names = set(PLACES)

    def named(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in names
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(named(element) for element in node.elts)
        return False

    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Compare)
            and any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops)
            and any(named(side) for side in (node.left, *node.comparators))]


def imports_a_module_of(tree: ast.AST, packages: tuple[str, ...]) -> bool:
    """Whether `tree` imports a module of one of `packages` (anywhere: in functions, under TYPE_CHECKING), or names one
    in a string (importlib.import_module, a lazy import by name)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            modules = [node.value]
        else:
            continue
        if any(m == p or m.startswith(p + ".") for m in modules for p in packages):
            return True
    return False


def imports_vast_or_slurm(tree: ast.AST) -> bool:
    """Whether `tree` imports a module of Vast.ai's or Slurm's folder."""
    return imports_a_module_of(tree, VAST_OR_SLURM)


def test_no_code_outside_the_places_compares_a_provider_name() -> None:
    found = {path.relative_to(LAUNCHER).as_posix(): lines for path in _outside_places()
             if (lines := compares_a_place_name(ast.parse(path.read_text())))}
    assert found == {}


def test_the_check_finds_each_way_of_comparing_a_name() -> None:
    for text in ('provider == "slurm"', 'record.get("provider") != "vast"', 'p not in ("vast", "slurm")',
                 '"local" == where.provider'):
        assert compares_a_place_name(ast.parse(text)) == [1], text
    for text in ('provider = "slurm"', 'x == "slurmd"', 'record.get("slurm")', 'n in {"nodes"}'):
        assert compares_a_place_name(ast.parse(text)) == [], text


def test_few_modules_outside_the_places_import_vast_or_slurm() -> None:
    found = {path.relative_to(LAUNCHER).as_posix() for path in _outside(("places/vast", "places/slurm"))
             if imports_vast_or_slurm(ast.parse(path.read_text()))}
    assert found == IMPORTING_A_PLACE
    assert len(found) <= 2  # the bound: the registry (and the command line's option table, if it must)
    assert imports_vast_or_slurm(ast.parse("def f():\n    from launcher.places import vast\n"))
    assert imports_vast_or_slurm(ast.parse("import launcher.places.slurm.scheduler\n"))
    assert imports_vast_or_slurm(ast.parse("COMMANDS = ('launcher.places.vast.commands',)\n"))
    assert not imports_vast_or_slurm(ast.parse("from launcher.places.ssh.hosts import SshHosts\n"))
    assert not imports_vast_or_slurm(ast.parse("from launcher.places.vast_like import x\n"))


def test_a_place_is_one_folder_that_only_the_registry_names() -> None:
    """Every place's code is in its folder: outside it, only the registry imports it (or names it for an import)."""
    assert PLACE_FOLDERS == ["local", "slurm", "ssh", "vast"]
    for name in PLACE_FOLDERS:
        folder = f"places/{name}"
        found = {path.relative_to(LAUNCHER).as_posix() for path in _outside((folder,))
                 if imports_a_module_of(ast.parse(path.read_text()), (f"launcher.{folder.replace('/', '.')}",))}
        assert found == IMPORTING_A_PLACE, name


def test_each_places_own_options_are_refused_elsewhere_with_its_hint() -> None:
    """The option errors come from the table: a place's own option given for another place is refused naming the
    place it belongs to and how to choose it."""
    refused = 0
    for owner in PLACES.values():
        for other in PLACES.values():
            names = [n for n in owner.own_options if n not in other.also_takes + other.unused_options
                     and not any(n in p.also_takes for p in PLACES.values())]  # a shared one: below
            if other is owner or not names:
                continue
            hosts = () if _takes_no_hosts(other) else parse_hosts(["u@10.0.0.2"])
            flag = flag_of(names[0])
            with pytest.raises(SpecError) as refusal:
                check_options_fit(other.name, hosts, "native", [flag])
            assert str(refusal.value) == (f"{flag} is for --provider {owner.name} only: {owner.own_options_hint}, "
                                          "or drop it")
            refused += 1
    assert refused == 5  # Vast's options on local, ssh; Slurm's on local, ssh, vast (Slurm reads --nodes itself)
    with pytest.raises(SpecError) as shared:  # --nodes: Vast's own, and Slurm reads it too
        check_options_fit("local", (), "native", ["--nodes"])
    assert str(shared.value) == ("--nodes is for --provider vast or slurm: add --provider vast to rent machines or "
                                 "--provider slurm --host LOGIN_NODE, or drop it")


def _takes_no_hosts(place: Place) -> bool:
    try:
        place.check_hosts(())
    except SpecError:
        return False
    return True
