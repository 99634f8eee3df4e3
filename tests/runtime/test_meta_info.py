"""SGLang's meta_info: finish reasons, logprob entries, and each token's text as SGLang decodes it."""
from __future__ import annotations

from dataclasses import dataclass

from radixlang.runtime.execution.sampler import TokenLogprob
from radixlang.runtime.meta_info import meta_info


@dataclass
class Status:
    rid: str = "r"
    prompt_tokens: int = 3
    cached_tokens: int = 1
    completion_tokens: int = 2
    finish_reason: str | None = "length"
    matched_stop: int | str | None = None
    error: str | None = None


def test_finish_reasons_follow_sglangs_shapes(tokenizer):
    def reason(**kw):
        return meta_info(tokenizer, Status(**kw), finished=True)["finish_reason"]

    assert reason(finish_reason="stop", matched_stop="\n") == {"type": "stop", "matched": "\n"}
    assert reason(finish_reason="length", completion_tokens=7) == {"type": "length", "length": 7}
    assert reason(finish_reason="abort", error="too long") == {"type": "abort", "message": "too long"}
    assert reason(finish_reason="abort") == {"type": "abort", "message": "request aborted"}
    running = meta_info(tokenizer, Status(), finished=False, e2e_latency=1.0)
    assert running == {"id": "r", "finish_reason": None, "prompt_tokens": 3, "cached_tokens": 1,
                       "completion_tokens": 2}  # no latency and no logprobs until asked / finished


def test_token_text_is_each_token_decoded_alone_specials_and_partial_characters_included(tokenizer):
    partial = next(t for t, raw in enumerate(tokenizer.token_bytes) if len(raw) == 1 and raw[0] >= 0xC0)
    special = tokenizer.eos_token_ids[0]
    word = tokenizer.encode(" cat")[-1]
    ids = [partial, special, word]
    lps = [TokenLogprob(t, -float(i), [(t, -float(i)), (word, -9.0)]) for i, t in enumerate(ids)]
    meta = meta_info(tokenizer, Status(), finished=True, return_logprob=True, with_text=True,
                     prompt_ids=[word, partial], logprob_start_len=0, input_logprobs=lps[1:2], output_logprobs=lps)
    # the oracle: the token's raw bytes read as UTF-8 with replacement (SGLang's batch_decode of single ids)
    text = {t: tokenizer.token_bytes[t].decode("utf-8", errors="replace") for t in ids}
    assert text[partial] == "\ufffd" and text[special] == "<|im_end|>" and text[word] == " cat"
    assert meta["output_token_logprobs"] == [[-float(i), t, text[t]] for i, t in enumerate(ids)]
    assert meta["output_top_logprobs"][0] == [[-0.0, partial, text[partial]], [-9.0, word, text[word]]]
    assert meta["input_token_logprobs"] == [[None, word, " cat"], [-1.0, special, text[special]]]
    assert meta["input_top_logprobs"][0] is None and len(meta["input_top_logprobs"]) == 2
    plain = meta_info(tokenizer, Status(), finished=True, return_logprob=True, output_logprobs=lps)
    assert [e[2] for e in plain["output_token_logprobs"]] == [None] * 3 and plain["input_token_logprobs"] == []
