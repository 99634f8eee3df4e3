"""The python blocks of the README and the docs pages, as the tests run them.

A block runs unless the line before it is `<!-- not tested: why -->` (a block that needs a vision model,
its own engine, a GPU...). RUNNABLE says how many blocks of each page run: tests/test_docs.py checks the
pages against it without a model (so a page cannot silently drop its examples, and a page's new python block
cannot go untested), and tests/e2e/test_doc_snippets.py runs them on the shared SmolLM2 engine.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# page (relative to the repo root) -> how many of its python blocks run in the suite; a page not listed
# must have none (mark a block `<!-- not tested: why -->`, or list the page here and in the e2e test)
RUNNABLE = {
    "README.md": 3,
    "docs/language.md": 6,
    "docs/engine.md": 1,
    "docs/constrained.md": 2,
    "docs/agents.md": 2,
    "docs/server.md": 2,
}

_FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
_NOT_TESTED = re.compile(r"<!--\s*not tested:\s*\S(?:(?!-->).)*-->\Z", re.S)  # the comment right before the fence


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # the fence's line, 1-based
    code: str
    tested: bool


def python_blocks(page: str) -> list[Block]:
    """Every ```python block of a page, in order, each marked whether it runs in the suite."""
    text = (ROOT / page).read_text()
    blocks = []
    for m in _FENCE.finditer(text):
        if m.group(1) != "python":
            continue
        before = text[:m.start()].rstrip()
        blocks.append(Block(page, text.count("\n", 0, m.start()) + 1, m.group(2),
                            tested=not _NOT_TESTED.search(before)))
    return blocks


def doc_pages() -> list[str]:
    """The README and the hand-written pages (docs/reference/ is generated from the code)."""
    return ["README.md"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))
