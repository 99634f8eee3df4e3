"""The calibration corpora (`mixed`: the shipped text, Python's own documentation, the installed packages'
READMEs and licences; `python`: the first two; `builtin` the first alone; `prose`, GPTQ's default, the
shipped prose of many registers): deterministic, tens of thousands of tokens of every
source, chat exchanges in the model's chat template, no overlap with the text the benchmark evaluates
quantized models on, and users' own files (plain text, JSON Lines)."""
from __future__ import annotations

import re
from itertools import islice
from pathlib import Path

import pytest
import torch

from radixlang.benchmark.fidelity import FIXED_TEXT, LONG_TEXT, STORY_TEXT
from radixlang.runtime.quantize.calibration import calibration_documents, calibration_samples
from radixlang.runtime.quantize.corpus import (
    PROSE,
    Document,
    file_documents,
    licence_documents,
    mixed_documents,
    prose_documents,
    python_documents,
    readme_documents,
    reference_documents,
    shipped_documents,
)
from radixlang.runtime.quantize.driver import QuantizeOptions

BUDGET_CHARS = 400_000  # well above what the default budget (32k tokens, ~4 characters each) takes
NGRAM = 8  # words: a shared run this long is copied text, not a common phrase
DEV_TEXT = (Path(__file__).parents[3] / "benchmark" / "quantization_dev.txt").read_text()  # where choices are made


class ByteTokenizer:
    """One token per UTF-8 byte; a chat template that marks each turn, as real ones do."""
    chat_template = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return "".join(f"<|{m['role']}|>{m['content']}" for m in messages)


def corpus_prefix(chars: int) -> list[Document]:
    docs, total = [], 0
    for doc in mixed_documents():
        docs.append(doc)
        total += len(doc.text)
        if total >= chars:
            return docs
    raise AssertionError(f"the mixed corpus holds only {total} characters")


def ngrams(text: str) -> set[tuple[str, ...]]:
    words = re.findall(r"[a-z0-9]+", text.lower())
    return {tuple(words[i:i + NGRAM]) for i in range(len(words) - NGRAM + 1)}


def test_corpus_is_large_deterministic_and_disjoint_from_the_evaluation_text():
    docs = corpus_prefix(BUDGET_CHARS)  # raises if the corpus is smaller
    assert docs == list(islice(mixed_documents(), len(docs)))
    held_out = ngrams(FIXED_TEXT + " " + LONG_TEXT + " " + STORY_TEXT)
    shared = set().union(*(ngrams(d.text + " " + (d.prompt or "")) for d in docs)) & held_out
    assert not shared, f"calibration text copies the evaluation text: {sorted(shared)[:3]}"
    text = {d.text for d in docs}  # every source is in the budget, in its share
    for source in (reference_documents(), readme_documents(), licence_documents()):
        assert 20 <= len(text.intersection(d.text for d in source)) < len(docs) / 2


def test_the_shipped_prose_is_large_varied_and_disjoint_from_the_evaluation_and_development_text():
    docs = list(prose_documents())
    assert docs == list(prose_documents())
    assert sum(len(d.text) + len(d.prompt or "") for d in docs) > 60_000  # ~15k tokens at ~4 characters each
    held_out = ngrams(FIXED_TEXT + " " + LONG_TEXT + " " + STORY_TEXT + " " + DEV_TEXT)
    shared = set().union(*(ngrams(d.text + " " + (d.prompt or "")) for d in docs)) & held_out
    assert not shared, f"calibration text copies the evaluation text: {sorted(shared)[:3]}"
    files = sorted(PROSE.glob("*.txt"))
    assert len(files) >= 8
    first_round = docs[:len(files)]  # any budget takes one document of every register first
    assert first_round == [file_documents(f)[0] for f in files]
    chats = [d for d in docs if d.prompt is not None]
    assert len(chats) >= 15 and all(not d.text.startswith("Assistant:") and "\nAssistant: " not in d.prompt for d in chats)
    assert not any(d.text.startswith("User: ") or d.text.strip() == "---" for d in docs)


def test_gptq_calibrates_on_all_of_the_shipped_prose_by_default_and_the_others_on_builtin():
    assert [QuantizeOptions(method=m).calibration() for m in ("gptq", "awq", "smoothquant")] == ["prose", "builtin", "builtin"]
    assert QuantizeOptions(method="gptq", calib="mixed").calibration() == "mixed"
    chars = sum(len(d.text) + len(d.prompt or "") for d in prose_documents())
    assert QuantizeOptions().calib_tokens > chars / 3.5  # the default budget holds all of it (~4 characters a token)


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


def test_a_users_jsonl_file_is_one_document_per_line_and_bad_lines_are_refused(tmp_path):
    good = tmp_path / "mine.jsonl"
    good.write_text('{"text": "First document."}\n\n{"text": "A reply.", "prompt": "A question?"}\n')
    assert list(calibration_documents(str(good))) == [Document("First document."), Document("A reply.", "A question?")]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n["no", "object"]\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        calibration_documents(str(bad))
