"""Every option the documentation names exists: in a `ddpctl COMMAND ...` line, an option of that command; any
other `--flag` in code, an option of some ddpctl command, of the trainer (`python -m trainer`), of a script of this
repository that the page runs, or of one of the outside tools the pages explain (torchrun, Slurm, Docker, MPI)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer

from launcher.cli.app import _register_commands, app

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
# Other programs' options that the pages explain, by program.
OUTSIDE_TOOLS = {
    "torchrun": {"--nnodes", "--node-rank", "--nproc-per-node", "--rdzv-conf", "--local-addr", "--log-dir",
                 "--master-port"},
    "sbatch / srun / sacct": {"--cpus-per-task", "--gpus-per-node", "--gres", "--kill-on-bad-exit", "--mem",
                              "--ntasks-per-node", "--open-mode", "--partitio", "--chdir", "--output", "--wrap",
                              "--array", "--wait", "--mpi", "--duplicates"},
    "docker / compose": {"--abort-on-container-exit", "--env-file", "--ipc", "--network", "--build",
                         "--exit-code-from"},
    "mpirun": {"--allow-run-as-root", "--bind-to", "--map-by"},
    "#SBATCH": {"--signal"},
    "mkdocs / pytest": {"--strict", "--dist", "--durations"},
    "tensorboard": {"--logdir"},
}
# Scripts of this repository whose options the pages name: their source must hold the option.
OWN_SCRIPTS = [*sorted((REPO / "infra").glob("*.sh")), *sorted((REPO / "bench").glob("*.py"))]


def ddpctl_options() -> dict[str, set[str]]:
    """Each command path (`up`, `vast login`, ...) and its option spellings; "" is the top level."""
    _register_commands()
    found: dict[str, set[str]] = {}

    def walk(command: Any, path: list[str]) -> None:
        found[" ".join(path)] = {"--help"} | {o for p in command.params for o in [*getattr(p, "opts", []),
                                                                     *getattr(p, "secondary_opts", [])]}
        for name, sub in (getattr(command, "commands", None) or {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return found


def trainer_options() -> set[str]:
    from trainer.__main__ import parse_command_line  # noqa: F401 - the parser is built inside; read its source

    source = (REPO / "trainer" / "__main__.py").read_text()
    return set(re.findall(r'add_argument\(\s*"(--[a-z0-9-]+)"', source))


def code_spans(text: str) -> list[str]:
    """Inline code and the lines of fenced blocks."""
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    return [line for block in blocks for line in block.splitlines()] + inline


def ddpctl_lines(spans: list[str], commands: dict[str, set[str]]) -> list[tuple[str, list[str]]]:
    """(command path, the options given to it) of each `ddpctl ...` in the spans."""
    found = []
    for span in spans:
        for match in re.finditer(r"(?:^|[\s($])ddpctl\s+([^|;&#]*)", span):
            try:
                words = shlex.split(match.group(1))
            except ValueError:
                words = match.group(1).split()
            path: list[str] = []
            while words and " ".join([*path, words[0]]) in commands:
                path.append(words.pop(0))
            words = words[:words.index("--")] if "--" in words else words  # what follows runs elsewhere
            found.append((" ".join(path), [w.split("=")[0] for w in words if re.fullmatch(r"--[a-z][a-z0-9-]*(=.*)?",
                                                                                              w)]))
    return found


def test_every_option_in_a_ddpctl_command_line_of_the_docs_is_one_of_that_command() -> None:
    commands = ddpctl_options()
    wrong = []
    for page in PAGES:
        for path, options in ddpctl_lines(code_spans(page.read_text()), commands):
            wrong += [f"{page.relative_to(REPO)}: `ddpctl {path} {o}`" for o in options if o not in commands[path]]
    assert wrong == [], "options the docs give to ddpctl commands that do not take them"


def test_every_option_named_in_the_docs_exists_somewhere() -> None:
    known = set().union(*ddpctl_options().values(), trainer_options(), *OUTSIDE_TOOLS.values())
    own = "\n".join(p.read_text() for p in OWN_SCRIPTS)
    wrong = []
    for page in PAGES:
        for span in code_spans(page.read_text()):
            for option in re.findall(r"(?<![\w-])(--[a-z][a-z0-9]*(?:-[a-z0-9]+)*)", span):
                if option not in known and option not in own and option != "--no":
                    wrong.append(f"{page.relative_to(REPO)}: {option} in `{span.strip()[:80]}`")
    assert wrong == [], "options the docs name that nothing takes"


@pytest.mark.parametrize("page", ["docs/reference/run-directory.md", "docs/guides/slurm.md"])
def test_the_trainers_own_options_are_named_as_such(page: str) -> None:
    text = " ".join((REPO / page).read_text().split())
    for option in ("--deterministic",):
        for at in (m.start() for m in re.finditer(re.escape(f"`{option}`"), text)):
            assert "trainer" in text[max(0, at - 120):at + 120], f"{page}: {option} is the trainer's, not ddpctl's"
