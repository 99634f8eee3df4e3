"""The calibration corpora (`builtin`: the shipped text, `python`: it and Python's own documentation):
deterministic, tens of thousands of tokens, chat exchanges in the model's
chat template, and no overlap with the text the benchmark evaluates quantized models on."""
from __future__ import annotations

import re
from itertools import islice

import torch

from radixlang.benchmark.fidelity import FIXED_TEXT, LONG_TEXT
from radixlang.runtime.quantize.calibration import calibration_samples
from radixlang.runtime.quantize.corpus import Document, python_documents, shipped_documents

BUDGET_CHARS = 400_000  # well above what the default budget (32k tokens, ~4 characters each) takes
NGRAM = 8  # words: a shared run this long is copied text, not a common phrase


class ByteTokenizer:
    """One token per UTF-8 byte; a chat template that marks each turn, as real ones do."""
    chat_template = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return "".join(f"<|{m['role']}|>{m['content']}" for m in messages)


def corpus_prefix(chars: int) -> list[Document]:
    docs, total = [], 0
    for doc in python_documents():
        docs.append(doc)
        total += len(doc.text)
        if total >= chars:
            return docs
    raise AssertionError(f"the python corpus holds only {total} characters")


def ngrams(text: str) -> set[tuple[str, ...]]:
    words = re.findall(r"[a-z0-9]+", text.lower())
    return {tuple(words[i:i + NGRAM]) for i in range(len(words) - NGRAM + 1)}


def test_corpus_is_large_deterministic_and_disjoint_from_the_evaluation_text():
    docs = corpus_prefix(BUDGET_CHARS)  # raises if the corpus is smaller
    assert docs == list(islice(python_documents(), len(docs)))
    shared = set().union(*(ngrams(d.text + " " + (d.prompt or "")) for d in docs)) & ngrams(FIXED_TEXT + " " + LONG_TEXT)
    assert not shared, f"calibration text copies the evaluation text: {sorted(shared)[:3]}"


def test_samples_fill_the_budget_and_chat_exchanges_use_the_chat_template():
    chats = [d for d in shipped_documents() if d.prompt is not None]
    assert len(chats) >= 3
    tok = ByteTokenizer()
    samples = calibration_samples(tok, python_documents(), seq_len=256, max_tokens=20_000)
    again = calibration_samples(tok, python_documents(), seq_len=256, max_tokens=20_000)
    assert all(torch.equal(a, b) for a, b in zip(samples, again)) and len(samples) == len(again)
    assert 20_000 - 256 < sum(len(s) for s in samples) <= 20_000
    assert max(len(s) for s in samples) == 256
    texts = [bytes(s.tolist()).decode(errors="replace") for s in samples]
    assert sum(t.startswith(f"<|user|>{c.prompt}<|assistant|>") for c in chats for t in texts) == len(chats)
