"""gen()'s fields come from the runtime's schema: its signature, names and errors stay SGLang's."""
from __future__ import annotations

import inspect

import pytest

import radixlang as rl
from radixlang.lang.gen_params import GEN_FIELDS, RUN_FIELDS, sampling_defaults
from radixlang.runtime.sampling_params import RULES
from radixlang.runtime.validation import parse_params

# SGLang 0.5.23's gen() parameters in their positional order (sglang/lang/api.py), written out rather than
# read from radixlang; `grammar` (Lark) is radixlang's own, keyword-only after them
SGLANG_GEN_PARAMETERS = [
    "name", "max_tokens", "min_tokens", "n", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k",
    "min_p", "frequency_penalty", "presence_penalty", "ignore_eos", "return_logprob", "logprob_start_len",
    "top_logprobs_num", "return_text_in_logprobs", "dtype", "choices", "choices_method", "regex", "json_schema",
]
SGLANG_GEN_INT_PARAMETERS = [  # gen_int / gen_string
    "name", "max_tokens", "n", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "ignore_eos", "return_logprob", "logprob_start_len",
    "top_logprobs_num", "return_text_in_logprobs",
]


def test_gens_signature_is_sglangs_and_every_keyword_is_a_derived_field():
    params = list(inspect.signature(rl.gen).parameters.values())
    assert [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD] == SGLANG_GEN_PARAMETERS
    tool_keywords = ["tools", "tool_choice", "parallel_tool_calls"]  # ours: they become a structural_tag
    reasoning = ["thinking_token_budget", "reasoning_parser"]  # reasoning models (docs/reasoning.md)
    assert [p.name for p in params if p.kind is p.KEYWORD_ONLY] == ["grammar", "structural_tag", *tool_keywords,
                                                                     *reasoning, "lora"]  # lora: docs/lora.md
    assert set(GEN_FIELDS) == (set(SGLANG_GEN_PARAMETERS + ["grammar", "structural_tag", "tool_calls", *reasoning,
                                                            "lora"]) - {"name", "n", "choices", "choices_method"})
    for fn in (rl.gen_int, rl.gen_string):
        assert list(inspect.signature(fn).parameters) == SGLANG_GEN_INT_PARAMETERS


def test_gen_takes_sglangs_positional_arguments():
    tip = rl.gen("tip", 64, None, 1, ["\n\n"])  # SGLang's test_parallel_decoding: gen("detailed_tip", max_tokens, ...)
    assert (tip.name, tip.params.max_tokens, tip.params.stop) == ("tip", 64, ["\n\n"])
    assert rl.gen_int("h", 8).params.max_tokens == 8
    with pytest.raises(ValueError, match="fork"):
        rl.gen("x", 8, None, 2)
    with pytest.raises(NotImplementedError, match="image"):
        rl.video("clip.mp4", 4)


def test_each_gen_sampling_field_reaches_the_engine_under_its_runtime_name():
    renamed = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens"}
    valid = {"max_tokens": 5, "min_tokens": 1, "stop": "x", "stop_token_ids": [3], "temperature": 0.5, "top_p": 0.5,
             "top_k": 3, "min_p": 0.1, "frequency_penalty": 0.5, "presence_penalty": 0.5, "ignore_eos": True,
             "regex": "a+", "grammar": 'start: "a"', "json_schema": "{}"}
    for name, value in valid.items():
        sent = rl.gen("v", **{name: value}).params.sampling_params()
        runtime_name = renamed.get(name, name)
        assert runtime_name in RULES and sent == {runtime_name: [value] if name == "stop" else value}
        parse_params(sent)  # the engine knows every name


def test_gen_and_run_defaults_name_a_bad_field_in_their_own_spelling():
    with pytest.raises(ValueError, match=r"^max_tokens must be in \[0, context_length\], got -1$"):
        rl.gen("v", max_tokens=-1)
    with pytest.raises(ValueError, match=r"^min_tokens must be in \[0, 3\], got 5$"):
        rl.gen("v", max_tokens=3, min_tokens=5)
    with pytest.raises(ValueError, match=r"^max_new_tokens must be in \[0, context_length\], got -1$"):
        sampling_defaults({"max_new_tokens": -1})  # run(max_new_tokens=...) is SGLang's run() spelling
    with pytest.raises(ValueError, match=r"^top_k must be in \[-1, vocab_size\], got -2$"):
        rl.gen("v", top_k=-2)


def test_run_takes_every_gen_field_but_the_constraints_under_the_runtimes_names():
    assert set(RUN_FIELDS) == {"max_new_tokens", "min_new_tokens", "stop", "stop_token_ids", "temperature", "top_p",
                               "top_k", "min_p", "frequency_penalty", "presence_penalty", "ignore_eos",
                               "return_logprob", "top_logprobs_num", "return_text_in_logprobs", "stop_regex",
                               "logprob_start_len", "thinking_token_budget", "reasoning_parser", "lora"}
    params = sampling_defaults({"max_new_tokens": 7, "min_new_tokens": 2, "stop": "\n"})
    assert (params.max_tokens, params.min_tokens, params.stop) == (7, 2, ["\n"])
