"""Calibration samples: token windows of a corpus of corpus.py (`builtin`, `python`) or of a user's text file.

Plain text is packed into windows of `seq_len` tokens, documents separated by a blank line; a chat exchange
is one sample, rendered with the model's chat template (how a chat model sees what users send), or as
"User: / Assistant:" lines for a model without one.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator

import torch

from ..tokenizer import Tokenizer
from .corpus import Document, python_documents, shipped_documents

MIN_TOKENS = 32  # a trailing window shorter than this is dropped


def calibration_documents(source: str) -> Iterator[Document]:
    """`builtin` (the shipped text), `python` (it and Python's own documentation), or the text of the file
    `source` as one document."""
    if source == "builtin":
        return iter(shipped_documents())
    if source == "python":
        return python_documents()
    path = Path(source)
    if not path.is_file():
        raise ValueError(f"--calib must be 'builtin', 'python' or a text file, got {source!r}")
    text = path.read_text()
    if not text.strip():
        raise ValueError(f"--calib file {source!r} is empty")
    return iter([Document(text)])


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
