"""The fenced code blocks of the docs (README.md and docs/*.md), read one way for every test that
checks them: each block's place (``path:line`` of its opening fence), language, text (dedented,
when the block sits indented in a list item) and the HTML comments on the lines right above it
(``<!-- doc-test: ... -->`` markers, tests/project/test_docs_run.py). project/test_docs_examples.py
loads their policy examples, project/test_docs_run.py runs their commands and programs.
"""
from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

from tests.support import REPO

#: Every page of the docs, README first.
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
#: A fenced block, possibly indented (inside a list item): its language and its text.
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)[ \t]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
_COMMENT = re.compile(r"^\s*<!--.*-->\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    """The page (absolute)."""
    line: int
    """The line of the opening fence (1-based)."""
    lang: str
    """The fence's language, lower case (``""`` when it names none)."""
    text: str
    """The block's text, dedented."""
    comments: tuple[str, ...]
    """The HTML comment lines right above the fence (no blank line between), top to bottom, stripped."""
    end: int
    """The offset just past the closing fence in the page's text."""

    @property
    def where(self) -> str:
        """``README.md:80``, ``docs/training.md:9``."""
        return f"{self.path.relative_to(REPO)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of one page, in order."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    out = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        above = []
        i = line - 2  # the line right above the fence (0-based)
        while i >= 0 and _COMMENT.match(lines[i]):
            above.insert(0, lines[i].strip())
            i -= 1
        out.append(Block(path, line, m.group("lang").lower(), textwrap.dedent(m.group("body")), tuple(above), m.end()))
    return out


def all_blocks() -> list[Block]:
    """Every fenced block of every page of :data:`DOCS`."""
    return [b for path in DOCS for b in blocks(path)]
