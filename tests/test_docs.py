"""The documentation: the MkDocs site builds strictly, its command-line reference lists every option, and every
command the getting-started page shows runs, in order, as a reader would type it. The tests that run mkdocs or
ddpctl start processes: integration tier."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
GETTING_STARTED = REPO / "docs" / "getting-started.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def build_site(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)], cwd=project,
                          capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built from this checkout, strictly (any warning fails)."""
    out = tmp_path_factory.mktemp("site")
    result = build_site(REPO, out)
    assert result.returncode == 0, result.stdout + result.stderr
    return out


@pytest.mark.integration
def test_the_site_builds_strictly_with_every_page(site: Path) -> None:
    pages = sorted(p.relative_to(REPO / "docs") for p in (REPO / "docs").rglob("*.md"))
    assert len(pages) >= 15, pages
    for page in pages:
        folder = page.parent if page.name == "index.md" else page.with_suffix("")
        html = site / folder / "index.html"
        assert html.is_file(), f"{page} was not built"


def copy_project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir(parents=True)
    shutil.copy(REPO / "mkdocs.yml", project / "mkdocs.yml")
    shutil.copytree(REPO / "docs", project / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    return project


@pytest.mark.integration
def test_a_broken_link_or_a_page_left_out_of_the_nav_fails_the_build(tmp_path: Path) -> None:
    project = copy_project(tmp_path)
    index = project / "docs" / "index.md"
    index.write_text(index.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    broken = build_site(project, tmp_path / "site1")
    assert broken.returncode != 0 and "no-such-page.md" in broken.stderr, broken.stderr

    project = copy_project(tmp_path / "again")
    (project / "docs" / "orphan.md").write_text("# Not in the nav\n")
    orphan = build_site(project, tmp_path / "site2")
    assert orphan.returncode != 0 and "orphan.md" in orphan.stderr, orphan.stderr


def visible_options(command_path: list[str]) -> list[str]:
    """Every spelling of every option `--help` shows for a command, from the parser itself."""
    sys.path.insert(0, str(REPO))
    import typer

    from launcher.cli.app import _register_commands, app

    _register_commands()
    command = typer.main.get_command(app)
    for name in command_path:
        command = command.commands[name]  # type: ignore[attr-defined]
    return [spelling for param in command.params if param.param_type_name == "option" and not param.hidden
            for spelling in (*param.opts, *param.secondary_opts)]


@pytest.mark.integration
def test_the_cli_reference_lists_every_option_of_up(site: Path) -> None:
    html = (site / "reference" / "cli" / "index.html").read_text()
    options = visible_options(["up"])
    assert len(options) > 40 and "--host" in options and "--dry-run" in options
    missing = [o for o in options if f"<code>{o}</code>" not in html]
    assert not missing, f"options of `up` missing from the CLI reference: {missing}"
    for command in ("up", "status", "logs", "pull", "down", "doctor", "offers", "report", "sweep", "image build",
                    "image push", "vast login"):
        assert f"<code>ddpctl {command}</code>" in html, command
    sweep_missing = [o for o in visible_options(["sweep"]) if f"<code>{o}</code>" not in html]
    assert not sweep_missing, sweep_missing


def getting_started_commands() -> list[str]:
    """The commands of the page's `bash` blocks, in order; any other block must be output (`text`)."""
    commands = []
    for language, body in FENCE.findall(GETTING_STARTED.read_text()):
        assert language in ("bash", "text"), f"a {language or 'plain'} block: commands go in `bash` blocks"
        if language == "bash":
            commands += [line for line in body.splitlines() if line.strip() and not line.startswith("#")]
    return commands


@pytest.mark.integration
@pytest.mark.timeout(1200)  # a run and a two-layout sweep: about a minute idle, minutes on a busy machine
def test_every_getting_started_command_runs(tmp_path: Path) -> None:
    commands = getting_started_commands()
    assert any(c.startswith("ddpctl up ") for c in commands) and any(c.startswith("ddpctl sweep ") for c in commands)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "ddpctl"  # `ddpctl` as the reader has it, from this checkout
    shim.write_text(f'#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} -m launcher "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    outputs = {}
    for command in commands:
        result = subprocess.run(["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True,
                                timeout=600)
        assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
        outputs[command] = result.stdout + result.stderr
    runs = sorted(p.name for p in (work / "runs").iterdir())
    first_run = next(r for r in runs if r.startswith("mnist-cnn-synthetic-"))
    assert (work / "runs" / first_run / "final_model.pt").is_file()
    assert "finished" in outputs["ddpctl status"] and first_run in outputs["ddpctl status"]
    dry_run = next(c for c in commands if "--dry-run" in c)
    assert "2 node(s) x 2 process(es)" in outputs[dry_run]
    assert len(runs) == 2, f"one run, one sweep, nothing from the dry run: {runs}"
    sweep = next(work.glob("runs/sweep-*"))
    for name in ("report.md", "scaling.png", "accuracy.png", "curves.png"):
        assert (sweep / name).is_file(), name


def test_no_page_points_outside_the_repository() -> None:
    texts = {p: p.read_text() for p in [REPO / "README.md", *(REPO / "docs").rglob("*.md")]}
    assert not [p for p, text in texts.items() if "/".join(("..", "shared")) in text]


def test_the_readme_gives_the_command_ci_runs() -> None:
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci == "bash infra/test.sh" and f"\n{ci}\n" in readme
    assert len(readme.splitlines()) <= 160


def test_every_link_of_the_readme_points_to_a_file_of_the_repository() -> None:
    readme = (REPO / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)", readme)
    local = [t for t in targets if "://" not in t]
    assert len(local) >= 10, local
    missing = [t for t in local if not (REPO / t).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"
