"""`grammar_backend` xgrammar / llguidance: the peer libraries behind our constraint interface.

Oracles: the `jsonschema` library validates what a tiny-model engine writes under a JSON schema, and each
library's own matcher -- built independently, from the HF tokenizer.json of the model folder (not from our
vocabulary) -- gives the masks along the engine's output: ours must allow exactly the tokens it allows at
every step, and it must accept the whole output. Each backend is skipped where its extra is not installed.
"""
from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from radixlang.runtime.constrained import backends
from radixlang.runtime.constrained.compiler import ConstraintCompiler
from radixlang.runtime.constrained.matcher import Matcher

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "pattern": "^[a-z ]{1,6}$"},  # xgrammar's free strings take raw control bytes
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"enum": ["a", "bc"]}, "maxItems": 2},
    "ok": {"type": "boolean"}}, "required": ["name", "age", "tags", "ok"], "additionalProperties": False}
PARAMS = {"temperature": 0, "max_new_tokens": 80, "json_schema": json.dumps(SCHEMA)}
PROMPTS = ["A person as JSON:", "Here is the record"]
SAMPLED = {**PARAMS, "temperature": 1.0, "seed": 5}


def installed(backend: str) -> str:
    pytest.importorskip(backend, reason=f"the `{backends.EXTRA}` extra is not installed")
    return backend


@pytest.fixture(scope="module", params=["xgrammar", "llguidance"])
def backend(request) -> str:
    return installed(request.param)


@pytest.fixture(scope="module")
def engine(backend, tiny_model_dir):
    from radixlang.runtime.engine import Engine

    engine = Engine(model=str(tiny_model_dir), device="cpu", kv_cache_tokens=4096, grammar_backend=backend)
    yield engine
    engine.check_invariants()
    engine.shutdown()


@pytest.fixture(scope="module")
def outputs(engine):
    return engine.generate(PROMPTS, PARAMS) + engine.generate(PROMPTS, SAMPLED)


def test_outputs_validate_against_the_schema(outputs):
    for out in outputs:
        assert out.meta.finish_reason == "stop"
        jsonschema.validate(json.loads(out.text), SCHEMA)


class XgrammarOracle:
    def __init__(self, hf, size: int):
        import xgrammar as xgr

        info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=size, stop_token_ids=[hf.eos_token_id or 0])
        self.compiled = xgr.GrammarCompiler(info).compile_json_schema(SCHEMA, any_whitespace=False, strict_mode=False,
                                                                       separators=(",", ":"))
        self.xgr, self.words = xgr, xgr.allocate_token_bitmask(1, size)

    def start(self) -> None:
        self.matcher = self.xgr.GrammarMatcher(self.compiled)

    def mask(self) -> np.ndarray:
        self.matcher.fill_next_token_bitmask(self.words)
        return self.words.numpy()[0]

    def accept(self, token: int) -> bool:
        return self.matcher.accept_token(token)


class LlguidanceOracle:
    def __init__(self, hf, size: int):
        import llguidance
        import llguidance.hf

        grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, overrides={
            "whitespace_flexible": False, "item_separator": ",", "key_separator": ":"})
        self.first = llguidance.LLMatcher(llguidance.hf.from_tokenizer(hf, n_vocab=size), grammar)
        self.words = np.zeros(-(-size // 32), np.int32)

    def start(self) -> None:
        self.matcher = self.first.deep_copy()

    def mask(self) -> np.ndarray:
        self.matcher.unsafe_compute_mask_ptr(self.words.ctypes.data, self.words.nbytes)
        return self.words

    def accept(self, token: int) -> bool:
        return self.matcher.consume_token(token)


def test_masks_equal_the_librarys_own_matcher_along_the_output(backend, engine, outputs, tiny_model_dir):
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_file=str(tiny_model_dir / "tokenizer.json"))
    constraint = engine.constraints.compile("json_schema", SCHEMA)
    vocab = constraint.vocab
    normal = np.zeros(vocab.size, bool)
    normal[vocab.ids] = True  # special tokens: ours never allows them but EOS, where the output may end
    oracle = (XgrammarOracle if backend == "xgrammar" else LlguidanceOracle)(hf, vocab.size)
    for out in outputs[:2] + outputs[3:]:
        oracle.start()
        ours = Matcher(constraint, vocab.end_ids)
        for token in out.output_ids:
            want = np.unpackbits(oracle.mask().view(np.uint8), count=vocab.size, bitorder="little").view(bool)
            got = np.unpackbits(ours.mask_words(ours.state).view(np.uint8), count=vocab.size,
                                bitorder="little").view(bool)
            diff = np.flatnonzero((got != want) & normal)
            assert not len(diff), [(int(t), vocab.bytes_of(int(t)), bool(got[t])) for t in diff[:8]]
            assert got[token]
            if token in vocab.end_ids:
                break
            assert oracle.accept(token) and ours.advance(token)
        assert ours.constraint.can_end(ours.state)


def test_drafts_walk_branches_and_come_back(backend, engine):
    """The request's one library matcher is moved between draft branches (roll back, feed again): masks
    after a detour equal those of a fresh walk."""
    constraint = engine.constraints.compile("json_schema", SCHEMA)
    tok = engine.tokenizer
    good = tok.encode('{"name":"ab","age":7', add_special_tokens=False)
    other = tok.encode('{"name":"xyz"', add_special_tokens=False)
    fresh = constraint.initial()
    for t in good:
        fresh = constraint.advance(fresh, t)
    want = constraint.allowed(fresh).copy()
    root = constraint.initial()
    states = [root]
    for t in good:
        states.append(constraint.advance(states[-1], t))
    branch = root
    for t in other:
        branch = constraint.advance(branch, t)
    assert constraint.advance(branch, tok.encode("}", add_special_tokens=False)[0]) is None  # refused, unchanged
    assert constraint.allowed(branch).any()
    np.testing.assert_array_equal(constraint.allowed(states[-1]), want)
    assert constraint.forced_bytes(states[3], 64) == constraint.forced_bytes(constraint.advance_bytes(
        constraint.initial(), tok.decode(good[:3]).encode()), 64)


def test_unsupported_features_name_the_backend(backend, engine):
    if backend == "xgrammar":
        with pytest.raises(ValueError, match="grammar_backend='xgrammar' does not support grammar"):
            engine.generate("x", {"max_new_tokens": 4, "grammar": 'start: "a"'})
    else:
        tag = {"type": "structural_tag", "format": {"type": "tags_with_separator", "separator": ",", "tags": [
            {"type": "tag", "begin": "<f>", "content": {"type": "json_schema", "json_schema": {}}, "end": "</f>"}]}}
        with pytest.raises(ValueError, match="grammar_backend='llguidance' does not support structural tags"):
            engine.generate("x", {"max_new_tokens": 4, "structural_tag": json.dumps(tag)})
    assert engine.generate("x", {"max_new_tokens": 3, "regex": "[ab]+"}).text  # healthy after the refusal


def test_regex_and_ebnf_hold(backend, engine):
    outs = [engine.generate("a", {"temperature": 0, "max_new_tokens": 16, "regex": r"(yes|no) [0-9]{2}"}),
            engine.generate("b", {"temperature": 0, "max_new_tokens": 16, "ebnf": 'root ::= "x" [0-9] "y"'})]
    import re

    assert re.fullmatch(r"(yes|no) [0-9]{2}", outs[0].text) and re.fullmatch(r"x[0-9]y", outs[1].text)


def test_a_missing_package_names_the_extra(monkeypatch, vocab):
    monkeypatch.setattr(backends.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"needs the llguidance package.*radixlang\[grammar\]"):
        ConstraintCompiler(lambda: vocab, backend="llguidance")


def test_structural_tags_on_xgrammar(engine, backend):
    if backend != "xgrammar":
        pytest.skip("llguidance takes triggered tags only: the refusal of the rest is tested above")
    schema = {"enum": ["Oslo", "Rome"]}  # (xgrammar's tags allow any whitespace inside an object)
    tag = {"type": "structural_tag", "format": {"type": "tags_with_separator", "separator": "\n", "at_least_one": True,
                                                "stop_after_first": True, "tags": [
        {"type": "tag", "begin": "<call>", "content": {"type": "json_schema", "json_schema": schema}, "end": "</call>"}]}}
    out = engine.generate("Call:", {"temperature": 0, "max_new_tokens": 24, "structural_tag": json.dumps(tag)})
    assert out.text.startswith("<call>") and out.text.endswith("</call>")
    jsonschema.validate(json.loads(out.text[len("<call>"):-len("</call>")]), schema)
    assert out.meta.finish_reason == "stop"


def test_ngram_speculation_gives_the_same_tokens(backend, engine, tiny_model_dir):
    """Draft trees move the request's library matcher across branches (roll back, feed again): the output
    equals the same backend's without speculation, and drafts were accepted."""
    from radixlang.runtime.engine import Engine

    schema = {"type": "object", "properties": {"codes": {"type": "array", "items": {
        "type": "integer", "minimum": 0, "maximum": 99}, "minItems": 12, "maxItems": 16}}, "required": ["codes"],
        "additionalProperties": False}
    params = {"temperature": 0, "max_new_tokens": 80, "json_schema": json.dumps(schema)}
    plain = engine.generate(PROMPTS, params)
    spec_engine = Engine(model=str(tiny_model_dir), device="cpu", kv_cache_tokens=4096, grammar_backend=backend,
                         speculative_algorithm="NGRAM")
    try:
        spec = spec_engine.generate(PROMPTS, params)
        assert [o.output_ids for o in spec] == [o.output_ids for o in plain]
        assert spec_engine.stats()["spec_accepted_tokens_total"] > 0
        spec_engine.check_invariants()
    finally:
        spec_engine.shutdown()
    for out in spec:
        jsonschema.validate(json.loads(out.text), schema)
