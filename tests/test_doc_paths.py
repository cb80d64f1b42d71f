"""The docs and the docstrings name only files that exist, and the architecture page's map of every module is made
from the tree with a summary for each, so a maintainer who follows a path finds the file, and a new module cannot
hide from the page."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "maintainers" / "architecture.md"
sys.path.insert(0, str(ROOT / "docs" / "hooks"))
from module_map import MARKER, first_sentence, module_map, module_summaries  # noqa: E402

# A path into the project's own folders, as docs and docstrings write them: launcher/execute/up.py, tests/x.py.
PROJECT_PATH = re.compile(r"(?<![\w./-])((?:launcher|trainer|infra|tests|bench|docs|examples)/[\w./-]*\w)")
# Names that look like paths but are not files of this tree: keys of torch's store, folders made at run time.
NOT_FILES = ("trainer/attempt-store", "trainer/nonce")


def texts() -> dict[Path, str]:
    """Every Markdown page and Python module of the project (the docs, the README, the code's docstrings); the tests
    are left out, whose paths are often those of a project they make."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for folder in ("launcher", "trainer", "infra", "bench", "docs"):
        files += sorted((ROOT / folder).rglob("*.py"))
    return {path: path.read_text(encoding="utf-8") for path in files}


def named_paths(text: str) -> set[str]:
    """The project paths a text names (trailing punctuation left out; globs and placeholders skipped)."""
    found = set()
    for match in PROJECT_PATH.finditer(text):
        path = match.group(1).rstrip(".")
        if any(mark in path for mark in ("*", "<", "{", "NAME", "...")) or path in NOT_FILES:
            continue
        found.add(path)
    return found


def test_every_path_named_in_docs_and_docstrings_exists():
    missing = sorted(f"{path.relative_to(ROOT)} names {named}" for path, text in texts().items()
                     for named in named_paths(text) if not (ROOT / named).exists())
    assert not missing, "\n".join(missing)


def test_named_paths_are_found_and_a_missing_one_is_told():
    text = "see launcher/execute/up.py, and `launcher/schedulers/run.py`. Keys: ddpctl-trainer/nonce; runs/*.json"
    assert named_paths(text) == {"launcher/execute/up.py", "launcher/schedulers/run.py"}
    assert not (ROOT / "launcher/schedulers/run.py").exists()


def test_every_module_has_a_summary_for_the_map():
    unsummarised = [path for path, summary in module_summaries(ROOT).items() if not summary]
    assert not unsummarised, "modules without a docstring: " + ", ".join(unsummarised)


def test_the_architecture_page_holds_the_map_of_every_module(tmp_path: Path):
    assert MARKER in ARCHITECTURE.read_text(encoding="utf-8")
    rendered = module_map(ROOT)
    for path in module_summaries(ROOT):
        folder, _, name = path.rpartition("/")
        assert f"### `{folder}/`" in rendered and f"| `{name}` |" in rendered
    # A module added to the tree is on the map at the next build, with its summary.
    (tmp_path / "launcher" / "places").mkdir(parents=True)
    (tmp_path / "launcher" / "places" / "toy.py").write_text('"""A toy place. More words."""\n')
    (tmp_path / "trainer").mkdir()
    assert "| `toy.py` | A toy place. |" in module_map(tmp_path)


def test_a_summary_is_the_first_sentence_on_one_line():
    assert first_sentence("Runs the node.  Then\nmore.\n\nOther paragraph.") == "Runs the node."
    assert first_sentence("a | b\nc") == "a \\| b c"
