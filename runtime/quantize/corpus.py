"""Calibration corpora, nothing downloaded: `builtin` (the default) and `python` (`--calib python`).

`builtin` is the text shipped with radixlang (calibration.txt, ~2k tokens written for it: prose on many
subjects, instructions, code, a story, chat exchanges), the mix of registers users send. Its chat exchanges
are rendered with the model's chat template (calibration.py), since that is how a chat model sees them.

`python` adds tens of thousands of tokens that every Python install carries, PSF-licensed, on the user's
own disk:
- the reference prose of Python's documentation, `pydoc_data.topics` (what `help("if")` prints);
- the docstrings of the standard library's modules, read from its source files with `ast` (never imported).
It is not the default: it is narrow (technical English with code) and slow to calibrate on. Measured on
SmolLM2-135M (fidelity.py's fixed / long text; RTN 12.09 / 17.73): through `radixlang quantize` with
act-order and percdamp 0.01, 16k tokens of it gave 10.32 / 15.76 against 10.45 / 16.10 for the shipped
text alone, but with the default percdamp 0.1 10.69 / 15.92 against 10.07 / 15.75, and it takes 240 s
of CPU against 60 s; in memory, without act-order, a prototype with 6k of its tokens was worse than the
shipped text (11.78 / 16.75 against 10.59 / 16.09). Use it (or a file of your own text) for a model that
will mostly read code.

Neither overlaps the benchmark's evaluation text (benchmark/fidelity.py; tests/runtime/quantize/
test_corpus.py checks for any shared run of 8 words). Deterministic for a given Python install: documents in
sorted order, shuffled with a fixed seed.
"""
from __future__ import annotations

import ast
import pydoc_data.topics
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

SHIPPED = Path(__file__).with_name("calibration.txt")
# standard-library packages whose docstrings are not prose a user writes (tests, generated tables, GUIs)
_SKIPPED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "idlelib", "tkinter", "turtledemo",
                           "lib2to3", "encodings", "__pycache__", "ensurepip"})
MIN_DOCSTRING_CHARS = 200  # shorter ones are one-line summaries: mostly a signature's words again
CHUNK_CHARS = 1500  # a reference topic is cut into pieces of about this many characters (~350 tokens)


@dataclass(frozen=True, slots=True)
class Document:
    text: str
    prompt: str | None = None  # a user's message: the text is the assistant's reply (a chat exchange)


def shipped_documents(path: Path = SHIPPED) -> list[Document]:
    """The shipped text's paragraphs; a "User: ... / Assistant: ..." paragraph is a chat exchange."""
    docs = []
    for para in path.read_text().split("\n\n"):
        para = para.strip()
        user, sep, reply = para.partition("\nAssistant: ")
        if para.startswith("User: ") and sep:
            docs.append(Document(reply, prompt=user.removeprefix("User: ")))
        elif para:
            docs.append(Document(para))
    return docs


def reference_documents() -> list[Document]:
    """Python's reference documentation (pydoc_data.topics), each topic cut at paragraph ends into
    pieces of about CHUNK_CHARS, so a budget takes many topics rather than the first few whole."""
    topics = pydoc_data.topics.topics
    docs = []
    for key in sorted(topics):
        piece = ""
        for para in topics[key].split("\n\n"):
            piece += para + "\n\n"
            if len(piece) >= CHUNK_CHARS:
                docs.append(Document(piece.strip()))
                piece = ""
        if piece.strip():
            docs.append(Document(piece.strip()))
    return docs


def docstring_documents(root: Path | None = None, seed: int = 0) -> Iterator[Document]:
    """The module, class and function docstrings of the standard library's source under `root` (default:
    this interpreter's), each of at least MIN_DOCSTRING_CHARS, file by file in an order shuffled by
    `seed`. Parsed, never imported, and lazily: a budget reads only the files it needs."""
    root = root or Path(sysconfig.get_paths()["stdlib"])
    paths = [p for p in sorted(root.rglob("*.py")) if not _SKIPPED_DIRS.intersection(p.relative_to(root).parts[:-1])]
    random.Random(seed).shuffle(paths)
    for path in paths:
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError):  # a file for another Python version, or not UTF-8
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                text = ast.get_docstring(node)
                if text and len(text) >= MIN_DOCSTRING_CHARS:
                    yield Document(text)


def python_documents(seed: int = 0) -> Iterator[Document]:
    """Every shipped document first (they set the mix of registers), then a reference piece and a
    docstring in turn (pieces in an order shuffled by `seed`); a token budget (calibration.py) takes
    them from the front."""
    yield from shipped_documents()
    reference = reference_documents()
    random.Random(seed).shuffle(reference)
    for piece, docstring in zip(reference, docstring_documents(seed=seed)):
        yield piece
        yield docstring
