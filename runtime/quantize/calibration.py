"""Calibration samples: token windows of a corpus of corpus.py (`builtin`, `prose`, `mixed`, `python`) or of a user's file.

Plain text is packed into windows of `seq_len` tokens, documents separated by a blank line; a chat exchange
is one sample, rendered with the model's chat template (how a chat model sees what users send), or as
"User: / Assistant:" lines for a model without one.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Iterator

import torch

from ..tokenizer import Tokenizer
from .corpus import Document, mixed_documents, prose_documents, python_documents, shipped_documents

MIN_TOKENS = 32  # a trailing window shorter than this is dropped


SOURCES = ("mixed", "builtin", "python", "prose")  # the named corpora (corpus.py); anything else is a file


def calibration_documents(source: str) -> Iterator[Document]:
    """`prose` (GPTQ's default: the shipped prose of many registers), `builtin` (the other methods': the
    shipped 2k tokens), `mixed` (it, then Python's documentation, docstrings,
    package READMEs and licences in turn), `python` (it and Python's own documentation),
    or a file of the user's: plain text (one document), or JSON Lines with a "text" field per line (one
    document each; a line with "prompt" too is a chat exchange)."""
    if source == "mixed":
        return mixed_documents()
    if source == "builtin":
        return iter(shipped_documents())
    if source == "python":
        return python_documents()
    if source == "prose":
        return prose_documents()
    path = Path(source)
    if not path.is_file():
        raise ValueError(f"--calibration must be one of {SOURCES} or a text / .jsonl file, got {source!r}")
    text = path.read_text()
    if not text.strip():
        raise ValueError(f"--calibration file {source!r} is empty")
    return iter(_jsonl_documents(path, text) if path.suffix == ".jsonl" else [Document(text)])


def _jsonl_documents(path: Path, text: str) -> list[Document]:
    docs = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            docs.append(Document(str(row["text"]), prompt=None if row.get("prompt") is None else str(row["prompt"])))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"--calibration {path}:{number}: each line must be a JSON object with a \"text\" field") from e
    return docs


def calibration_samples(tokenizer: Tokenizer, documents: Iterable[Document], seq_len: int,
                        max_tokens: int) -> list[torch.Tensor]:
    """Samples of at most `seq_len` tokens, at most `max_tokens` in all, from the documents in order: plain ones
    packed into consecutive windows, each chat exchange its own sample."""
    samples: list[torch.Tensor] = []
    stream: list[int] = []  # plain text not yet cut into windows
    total = 0
    for doc in documents:
        if doc.prompt is None:
            stream += tokenizer.encode(doc.text + "\n\n")
            while len(stream) >= seq_len and total < max_tokens:
                size = min(seq_len, max_tokens - total)
                samples.append(torch.tensor(stream[:size]))
                stream, total = stream[size:], total + size
        elif total < max_tokens:
            ids = tokenizer.encode(chat_text(tokenizer, doc))[:seq_len]
            samples.append(torch.tensor(ids))
            total += len(ids)
        if total >= max_tokens:
            break
    tail = stream[:max_tokens - total]
    return samples + [torch.tensor(tail)] * (len(tail) >= MIN_TOKENS)


def chat_text(tokenizer: Tokenizer, doc: Document) -> str:
    messages: list[dict[str, object]] = [{"role": "user", "content": doc.prompt}, {"role": "assistant", "content": doc.text}]
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=False)
    return f"User: {doc.prompt}\nAssistant: {doc.text}"
