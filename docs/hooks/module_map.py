"""MkDocs hook: the map of every module, rendered from the tree at every build, so it cannot drift.

A page holding the marker line `<!-- module-map -->` gets, in its place, one table per package of `launcher/` and
`trainer/`: each module's path and the first sentence of its docstring (tests/test_doc_paths.py checks that every
module has one)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

MARKER = "<!-- module-map -->"
REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("launcher", "trainer")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace the marker with the map (MkDocs calls this for every page)."""
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, module_map(REPO))


def module_summaries(root: Path) -> dict[str, str]:
    """Each module's path below root (launcher/ and trainer/, `__init__.py` included) and its docstring's first
    sentence ("" where it has none)."""
    summaries = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
            summaries[str(path.relative_to(root))] = first_sentence(doc)
    return summaries


def first_sentence(doc: str) -> str:
    """The docstring's first paragraph up to its first full stop, on one line, with table pipes escaped."""
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    end = paragraph.find(". ")
    sentence = paragraph if end < 0 else paragraph[:end + 1]
    return sentence.replace("|", "\\|")


def module_map(root: Path) -> str:
    """Markdown: a heading and a two-column table per folder that holds modules."""
    by_folder: dict[str, list[tuple[str, str]]] = {}
    for path, summary in module_summaries(root).items():
        folder, _, name = path.rpartition("/")
        by_folder.setdefault(folder, []).append((name, summary))
    lines: list[str] = []
    for folder in sorted(by_folder):
        lines += [f"### `{folder}/`", "", "| module | what it holds |", "| --- | --- |"]
        lines += [f"| `{name}` | {summary} |" for name, summary in by_folder[folder]]
        lines.append("")
    return "\n".join(lines)
