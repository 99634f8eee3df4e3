"""Tokenizer built from GGUF metadata: the reference ids, round trips, chat template, HF-folder parity."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from radixlang.runtime.detokenizer import IncrementalDetokenizer
from radixlang.runtime.tokenizer import Tokenizer

REFERENCE = json.loads((Path(__file__).parents[1] / "data" / "hf_greedy_smollm2.json").read_text())["cases"]


@pytest.mark.parametrize("case", REFERENCE, ids=lambda c: c["prompt"][:24])
def test_encode_matches_hf_tokenizer_ids(tokenizer, case):
    assert tokenizer.encode(case["input_text"]) == case["input_ids"]


@pytest.mark.parametrize("case", [c for c in REFERENCE if c["kind"] == "chat"][:4], ids=lambda c: c["prompt"][:24])
def test_chat_template_renders_like_hf(tokenizer, case):
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": case["prompt"]}])
    assert rendered == case["input_text"]


def test_chat_template_keeps_explicit_system_prompt(tokenizer):
    text = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=False,
    )
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"


def test_chat_template_rejects_malformed_message(tokenizer):
    with pytest.raises(ValueError, match="role"):
        tokenizer.apply_chat_template([{"content": "no role"}])


def test_special_tokens_and_eos(tokenizer):
    assert tokenizer.eos_token_ids == (2,)
    assert tokenizer.encode("<|im_start|>") == [1]
    assert {0, 1, 2} <= tokenizer.special_token_ids
    assert tokenizer.decode([1, 2]) == ""
    assert tokenizer.decode([1, 2], skip_special_tokens=False) == "<|im_start|><|im_end|>"


def test_digits_are_split_one_by_one(tokenizer):
    ids = tokenizer.encode("2024")
    assert [tokenizer.decode([i]) for i in ids] == ["2", "0", "2", "4"]


def representable(tokenizer: Tokenizer, text: str) -> bool:
    """SmolLM2's vocab lacks a few byte tokens (e.g. 0xF1); text using them cannot round-trip."""
    single_bytes = {b[0] for b in tokenizer.token_bytes if len(b) == 1}
    return all(b in single_bytes for b in text.encode())


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_round_trip_any_representable_text(tokenizer, text):
    assume(representable(tokenizer, text))
    assert tokenizer.decode(tokenizer.encode(text), skip_special_tokens=False) == text


def test_token_bytes_concatenate_to_utf8(tokenizer):
    text = "naïve café — 東京 😀\n\tend"
    ids = tokenizer.encode(text)
    assert b"".join(tokenizer.token_bytes[i] for i in ids) == text.encode()
    assert len(tokenizer.token_bytes) == tokenizer.vocab_size == 49152


def test_hf_folder_tokenizer_equals_gguf_tokenizer(tokenizer, tiny_model_dir):
    hf = Tokenizer.from_hf_dir(tiny_model_dir)
    text = "<|im_start|>user\nHello 123 wörld 😀<|im_end|>"
    assert hf.encode(text) == tokenizer.encode(text)
    assert hf.eos_token_ids == tokenizer.eos_token_ids
    assert hf.token_bytes[:300] == tokenizer.token_bytes[:300]
    assert hf.apply_chat_template([{"role": "user", "content": "x"}]) == tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}])


def test_gguf_rejects_unsupported_tokenizer_model():
    with pytest.raises(ValueError, match="not supported"):
        Tokenizer.from_gguf_metadata({"tokenizer.ggml.model": "llama"})


# ---- incremental detokenization -------------------------------------------------------------


def stream_text(tokenizer, ids, **kw) -> tuple[list[str], IncrementalDetokenizer]:
    """Feeds ids one at a time, as the scheduler does, until a stop string ends the stream."""
    detok = IncrementalDetokenizer(tokenizer, **kw)
    deltas = []
    for i in ids:
        result = detok.add([i])
        deltas.append(result.delta)
        if result.stop is not None:
            break
    return deltas, detok


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=40))
def test_stream_never_emits_half_a_character(tokenizer, text):
    assume(representable(tokenizer, text))
    ids = tokenizer.encode(text)
    deltas, detok = stream_text(tokenizer, ids)
    assert "\ufffd" in text or all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) + detok.flush() == tokenizer.decode(ids)


def test_a_token_whose_own_text_is_the_replacement_character_is_released_by_flush(tokenizer):
    token = 24211  # SmolLM2 decodes it to a literal U+FFFD (hypothesis found it)
    assert tokenizer.decode([token]).endswith("\ufffd")
    deltas, detok = stream_text(tokenizer, tokenizer.encode("ab") + [token])
    assert "".join(deltas) + detok.flush() == tokenizer.decode(tokenizer.encode("ab") + [token])


def test_emoji_split_over_byte_tokens_is_released_whole(tokenizer):
    ids = tokenizer.encode("😀")
    assert len(ids) > 1  # the emoji spans several byte tokens
    deltas, _ = stream_text(tokenizer, ids)
    assert deltas[:-1] == [""] * (len(ids) - 1) and deltas[-1] == "😀"


def test_stop_string_spanning_tokens_is_trimmed_and_never_released(tokenizer):
    text = "The answer is 42. END of story"
    ids = tokenizer.encode(text)
    deltas, detok = stream_text(tokenizer, ids, stop=["END of"])
    released = "".join(deltas)
    assert released == "The answer is 42. "
    assert detok.text == "The answer is 42. "


def test_stop_string_kept_with_no_stop_trim(tokenizer):
    ids = tokenizer.encode("abc STOP def")
    deltas, detok = stream_text(tokenizer, ids, stop=["STOP"], trim_stop=False)
    assert detok.text == "abc STOP"


def test_stop_regex_spanning_tokens_is_trimmed_and_never_released(tokenizer):
    text = "The answer is 42. Total: 17 apples left"
    deltas, detok = stream_text(tokenizer, tokenizer.encode(text), stop_regex=[r"[0-9]+ apples"])
    assert "".join(deltas) == detok.text == "The answer is 42. Total: "
    kept = stream_text(tokenizer, tokenizer.encode(text), stop_regex=[r"[0-9]+ apples"], trim_stop=False)[1]
    assert kept.text == "The answer is 42. Total: 17 apples"


def test_text_a_stop_regex_cannot_match_is_released(tokenizer):
    ids = tokenizer.encode("one two three four five six")
    deltas, detok = stream_text(tokenizer, ids, stop_regex=["x{2}y"])  # matches at most 3 characters
    assert len("".join(deltas)) >= len(detok.text) - 2  # only the last 2 characters are held back
    assert "".join(deltas) + detok.flush() == "one two three four five six"


def test_partial_stop_prefix_is_released_when_it_does_not_complete(tokenizer):
    ids = tokenizer.encode("x EN y")
    deltas, detok = stream_text(tokenizer, ids, stop=["END"])
    assert "".join(deltas) + detok.flush() == "x EN y"


def test_prompt_context_keeps_word_initial_space(tokenizer):
    prompt = tokenizer.encode("Hello")
    ids = tokenizer.encode("Hello world")[len(prompt):]
    deltas, _ = stream_text(tokenizer, ids, context_ids=prompt)
    assert "".join(deltas) == " world"


def test_encode_batch_gives_the_reference_ids_of_each_text(tokenizer):
    texts = [c["input_text"] for c in REFERENCE[:6]]
    assert tokenizer.encode_batch(texts) == [c["input_ids"] for c in REFERENCE[:6]]


class PlainDetokenizer:
    """The incremental algorithm spelled out with no memo: both windows decoded on every add."""

    def __init__(self, tokenizer, stop=(), context_ids=()):
        self.tok, self.stop = tokenizer, list(stop)
        self.ids = list(context_ids[-5:])
        self.prefix, self.read, self.text, self.released = 0, len(self.ids), "", 0

    def add(self, token: int) -> tuple[str, str | None]:
        self.ids.append(token)
        before = self.tok.decode(self.ids[self.prefix:self.read])
        after = self.tok.decode(self.ids[self.prefix:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            start = len(self.text)
            self.text += after[len(before):]
            self.prefix, self.read = self.read, len(self.ids)
            hits = [(i, s) for s in self.stop if (i := self.text.find(s, max(0, start - len(s) + 1))) != -1]
            if hits:
                index, stop = min(hits)
                self.text = self.text[:index]
                return self.release(0), stop
        hold = max([k for s in self.stop for k in range(1, len(s)) if self.text.endswith(s[:k])], default=0)
        return self.release(hold), None

    def flush(self) -> str:
        before = self.tok.decode(self.ids[self.prefix:self.read])
        self.text += self.tok.decode(self.ids[self.prefix:])[len(before):]
        self.prefix = self.read = len(self.ids)
        return self.release(0)

    def release(self, hold: int) -> str:
        end = max(self.released, len(self.text) - hold)
        delta, self.released = self.text[self.released:end], end
        return delta


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 49151), st.sampled_from([24211, 216, 127, 49152 - 1, 0, 1, 2])),
                max_size=40),
       st.lists(st.sampled_from(["e", "th", " the", "\ufffd", "é", "ab", "\n"]), max_size=2),
       st.integers(0, 20))
def test_memoized_detokenizer_streams_what_decoding_both_windows_every_time_streams(tokenizer, ids, stop, flush_at):
    """Random ids (byte tokens split characters, special tokens, U+FFFD's own token), with and without stop
    strings, flushed part way: every delta, the stop and the flushed tail match the plain algorithm."""
    context = [1, 2, 3, 504, 2843, 314]
    fast = IncrementalDetokenizer(tokenizer, stop, context_ids=context)
    plain = PlainDetokenizer(tokenizer, stop, context)
    for i, token in enumerate(ids):
        if i == flush_at:
            assert fast.flush() == plain.flush()
        result = fast.add([token])
        assert (result.delta, result.stop) == plain.add(token)
        if result.stop is not None:
            return
    assert fast.flush() == plain.flush()


@pytest.mark.parametrize("skip", [True, False])
def test_decode_token_is_decode_of_that_one_token(tokenizer, skip):
    for token in [0, 1, 2, 216, 24211, 504, 49151, 216, 0]:  # repeats come from the memo
        assert tokenizer.decode_token(token, skip) == tokenizer.decode([token], skip)
