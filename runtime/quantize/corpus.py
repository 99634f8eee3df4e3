"""Calibration corpora, nothing downloaded: `prose` (GPTQ's default), `builtin` (the other methods'),
`mixed` and `python`.

`prose` is text shipped with radixlang (prose/*.txt, ~21k tokens written for it under its licence), one
file per everyday register: fiction with dialogue, short stories, letters and emails, news and opinion,
encyclopedic prose, how-to and recipes, chat exchanges, forum posts, interviews and conversations, reviews,
lists / tables / a little code; one document of each file in turn (prose_documents). On SmolLM2-135M GPTQ
on all of it rounded the development text better than on `builtin`, AWQ worse (docs/models.md).

`builtin` is the earlier shipped text (calibration.txt, ~2k tokens written for it: prose on many
subjects, instructions, code, a story, chat exchanges). Chat exchanges, in either, are rendered with the
model's chat template (calibration.py), since that is how a chat model sees them.

`mixed` adds, in turn, pieces of four sources that every install of radixlang carries on the user's own
disk (read, never imported, and never redistributed: each stays under its own licence):
- the reference prose of Python's documentation, `pydoc_data.topics` (what `help("if")` prints; PSF);
- the docstrings of the standard library's modules, read from its source files with `ast` (PSF);
- the long descriptions (READMEs) of the installed packages under a permissive licence (MIT, BSD, Apache,
  PSF, MPL, ISC...; GPL-family ones left out): prose, lists, tables, shell sessions, code, numbers;
- the licence texts those packages carry, each licence once (legal English).
With radixlang's dependencies that is over a megabyte of text (~400k tokens); a token budget takes the
shipped text first, then the four sources in equal turns. It is not the default: on SmolLM2-135M, GPTQ
on 16k of its tokens rounded held-out prose worse than on the shipped 2k (docs/models.md), the way 6k
tokens of Python's documentation alone did in an earlier session (docs/changelog-2.md): technical text
moves H away from the prose the model reads. For a model that will read code and documentation.

`python` is the shipped text plus the first two sources (for a model that will mostly read code).

None overlaps the benchmark's evaluation text (benchmark/fidelity.py; tests/runtime/quantize/
test_corpus.py checks for any shared run of 8 words). Deterministic for a given set of installed
packages: documents in sorted order, shuffled with a fixed seed.
"""
from __future__ import annotations

import ast
import pydoc_data.topics
import random
import re
import sysconfig
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Iterator

SHIPPED = Path(__file__).with_name("calibration.txt")
PROSE = Path(__file__).with_name("prose")  # one file per register, documents separated by a "---" line
# standard-library packages whose docstrings are not prose a user writes (tests, generated tables, GUIs)
_SKIPPED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "idlelib", "tkinter", "turtledemo",
                           "lib2to3", "encodings", "__pycache__", "ensurepip"})
MIN_DOCSTRING_CHARS = 200  # shorter ones are one-line summaries: mostly a signature's words again
_PERMISSIVE = re.compile(r"\b(MIT|BSD|Apache|ISC|PSF|Python Software Foundation|MPL|Mozilla|Unlicense|zlib|0BSD|HPND)", re.I)
_COPYLEFT = re.compile(r"\b(GPL|LGPL|AGPL|General Public)", re.I)
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


def prose_documents(folder: Path = PROSE) -> Iterator[Document]:
    """The shipped prose (~21k tokens written for radixlang, one file per register: fiction with dialogue,
    short stories, letters and emails, news and opinion, encyclopedic prose, instructions and recipes, chat
    exchanges, forum posts, interviews, reviews, lists and tables), one document of each file in turn, so any
    token budget takes every register."""
    yield from _in_turn([iter(file_documents(path)) for path in sorted(folder.glob("*.txt"))])


def file_documents(path: Path) -> list[Document]:
    """A prose file's documents, separated by a "---" line; one that starts "User: " and has an
    "Assistant: " line is a chat exchange (the reply may run over several paragraphs)."""
    docs = []
    for text in re.split(r"\n---\n", path.read_text()):
        text = text.strip()
        user, sep, reply = text.partition("\nAssistant: ")
        if text.startswith("User: ") and sep:
            docs.append(Document(reply.strip(), prompt=user.removeprefix("User: ").strip()))
        elif text:
            docs.append(Document(text))
    return docs


@cache
def reference_documents() -> tuple[Document, ...]:
    """Python's reference documentation (pydoc_data.topics), each topic cut at paragraph ends into
    pieces of about CHUNK_CHARS, so a budget takes many topics rather than the first few whole."""
    topics = pydoc_data.topics.topics
    return tuple(Document(piece) for key in sorted(topics) for piece in chunks(topics[key]))


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


def chunks(text: str, size: int = CHUNK_CHARS) -> list[str]:
    """`text` cut at paragraph ends into pieces of about `size` characters."""
    pieces, piece = [], ""
    for para in text.split("\n\n"):
        piece += para + "\n\n"
        if len(piece) >= size:
            pieces.append(piece.strip())
            piece = ""
    return pieces + [piece.strip()] * bool(piece.strip())


def _permissive(dist: metadata.Distribution) -> bool:
    m = dist.metadata
    words = " ".join([m["License-Expression"] or "", (m["License"] or "")[:200],
                      *(c for c in m.get_all("Classifier") or [] if c.startswith("License"))])
    return bool(_PERMISSIVE.search(words)) and not _COPYLEFT.search(words)


def _distributions() -> list[metadata.Distribution]:
    """The installed distributions under a permissive licence, by name (one copy of each), radixlang's own
    left out (its text is the repository's)."""
    by_name = {}
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name and name != "radixlang" and name not in by_name and _permissive(dist):
            by_name[name] = dist
    return [by_name[n] for n in sorted(by_name)]


@cache
def readme_documents() -> tuple[Document, ...]:
    """The long descriptions (READMEs: prose, lists, tables, code, numbers) of the installed packages under a
    permissive licence, each cut into pieces of about CHUNK_CHARS."""
    docs = []
    for dist in _distributions():
        text = dist.metadata.get_payload() or dist.metadata["Description"] or ""  # type: ignore[attr-defined]
        docs += [Document(piece) for piece in chunks(text.replace("\r\n", "\n")) if len(piece) >= MIN_DOCSTRING_CHARS]
    return tuple(docs)


@cache
def licence_documents() -> tuple[Document, ...]:
    """The licence texts the installed permissive packages carry (legal English), each kind once: a text
    half of whose runs of 8 words an earlier one had (the same licence, another holder) is left out."""
    docs: list[Document] = []
    seen: set[tuple[str, ...]] = set()
    for dist in _distributions():
        for file in sorted(dist.files or [], key=str):
            if not file.name.upper().startswith(("LICENSE", "LICENCE", "COPYING")):
                continue
            try:
                text = file.read_text() or ""
            except (OSError, UnicodeDecodeError):
                continue
            words = re.findall(r"[a-z]+", text.lower())
            runs = {tuple(words[i:i + 8]) for i in range(len(words) - 7)}
            if len(text) >= MIN_DOCSTRING_CHARS and len(runs & seen) < len(runs) / 2:
                seen |= runs
                docs += [Document(piece) for piece in chunks(text)]
    return tuple(docs)


def mixed_documents(seed: int = 0) -> Iterator[Document]:
    """`--calibration mixed`: every shipped document, then one piece of each installed source in turn (Python's
    reference, a standard-library docstring, a package README, a licence), each source in an order shuffled
    by `seed`, so any token budget takes all of them in the same proportions; a source that runs out
    drops out of the turn."""
    yield from shipped_documents()
    yield from _in_turn([iter(_shuffled(reference_documents(), seed)), docstring_documents(seed=seed),
                         iter(_shuffled(readme_documents(), seed)), iter(_shuffled(licence_documents(), seed))])


def _in_turn(sources: list[Iterator[Document]]) -> Iterator[Document]:
    """One document of each source in turn; a source that runs out drops out of the turn."""
    while sources:
        for source in list(sources):
            doc = next(source, None)
            if doc is None:
                sources.remove(source)
            else:
                yield doc


def _shuffled(docs: tuple[Document, ...], seed: int) -> list[Document]:
    shuffled = list(docs)
    random.Random(seed).shuffle(shuffled)
    return shuffled


def python_documents(seed: int = 0) -> Iterator[Document]:
    """Every shipped document first (they set the mix of registers), then a reference piece and a
    docstring in turn (pieces in an order shuffled by `seed`); a token budget (calibration.py) takes
    them from the front."""
    yield from shipped_documents()
    for piece, docstring in zip(_shuffled(reference_documents(), seed), docstring_documents(seed=seed)):
        yield piece
        yield docstring
