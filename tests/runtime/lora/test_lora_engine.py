"""Multi-LoRA serving in the engine, against PEFT + transformers on the same weights (tests/lora_peft.py):

- the exact mode: one concurrent batch mixing three adapters (all seven targets, different ranks, rsLoRA) and the
  base gives each request PEFT's greedy tokens;
- the default mode, with fewer device slots than adapters (slots reused, admission waits for a slot): each
  adapter's tokens are the same alone and mixed;
- the radix cache: KV is reused within an adapter only, never across adapters or with the base; unloading frees
  the adapter's tree, and a reload under the same name shares nothing with the old weights;
- an adapter in use unloads when its running request ends; refusals name what they refuse.
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from radixlang.kernels.lora import native_available
from radixlang.runtime.lora import UnknownAdapter
from radixlang.runtime.lora.adapter import load_peft_adapter
from tests.lora_peft import peft_greedy

PROMPTS = [[1, 504, 2231, 30, 9, 712, 88], [1, 42, 17, 3003, 41000, 615, 2048, 77, 9, 5, 61]]
NEW = 10
NAMES = [None, "a0", "a1", "a2"]
GREEDY = {"temperature": 0, "max_new_tokens": NEW}


def lora_paths(adapters) -> list[str]:
    return [f"{name}={path}" for name, path in adapters.items()]


@pytest.fixture(scope="module")
def peft_tokens(tiny_model_dir, lora_adapters) -> dict[str | None, list[list[int]]]:
    return {name: peft_greedy(tiny_model_dir, None if name is None else lora_adapters[name], PROMPTS, NEW)
            for name in NAMES}


def mixed(engine, names=NAMES) -> dict[str | None, list[list[int]]]:
    """Every prompt under every adapter (and the base) in one call: admitted together, one batch."""
    prompts = [p for _ in names for p in PROMPTS]
    loras = [n for n in names for _ in PROMPTS]
    outs = engine.generate(input_ids=prompts, sampling_params=GREEDY, lora=loras)
    return {n: [o.output_ids for o in outs[i * len(PROMPTS):(i + 1) * len(PROMPTS)]] for i, n in enumerate(names)}


def test_a_batch_mixing_three_adapters_and_the_base_equals_peft_in_the_exact_mode(
        tiny_engine_factory, lora_adapters, peft_tokens):
    engine = tiny_engine_factory(quantization="none", lora_paths=lora_paths(lora_adapters))
    assert engine.lora.dtype == torch.float32  # PEFT's weights, as they are
    assert len({tuple(t[0]) for t in peft_tokens.values()}) == 4  # each adapter changes the answer
    assert mixed(engine) == peft_tokens
    assert engine.lora_adapters() == {name: str(path) for name, path in lora_adapters.items()}


def test_default_mode_each_adapters_tokens_are_the_same_alone_and_mixed_with_fewer_slots(
        tiny_engine_factory, lora_adapters):
    engine = tiny_engine_factory(lora_paths=lora_paths(lora_adapters), max_loras_per_batch=2)
    if native_available():  # the native CPU kernel, on the default mode's int8 adapter weights
        assert engine.lora.native and engine.lora.dtype == torch.int8
    alone = {n: [engine.generate(input_ids=p, sampling_params=GREEDY, lora=n).output_ids for p in PROMPTS]
             for n in NAMES}
    engine.flush_cache()
    assert mixed(engine) == alone  # 3 adapters on 2 slots: the third waits for a slot, then takes one
    assert mixed(engine, NAMES[::-1]) == alone  # again, the prompts' KV now cached


def test_kv_is_reused_within_an_adapter_only_and_unloading_frees_it(tiny_engine_factory, lora_adapters):
    engine = tiny_engine_factory(quantization="none", lora_paths=lora_paths(lora_adapters))
    prompt = PROMPTS[1] * 3

    def run(name):
        out = engine.generate(input_ids=prompt, sampling_params=GREEDY, lora=name)
        return out.output_ids, out.meta.cached_tokens

    first, cached = run("a0")
    assert cached == 0
    assert run("a0") == (first, len(prompt) - 1)  # its own KV, reused
    assert run("a1")[1] == 0 and run(None)[1] == 0  # never another adapter's, nor the base's
    held = engine.stats()["kv_cached_tokens"]
    engine.unload_lora_adapter("a0")
    assert engine.stats()["kv_cached_tokens"] < held  # its tree is gone
    with pytest.raises(UnknownAdapter, match="'a0' is not loaded"):
        engine.generate(input_ids=prompt, sampling_params=GREEDY, lora="a0")
    engine.load_lora_adapter("a0", lora_adapters["a0"])
    assert run("a0") == (first, 0)  # the same weights, but a new load shares no KV with the old one
    engine.check_invariants()


def test_ngram_speculation_keeps_each_adapters_tokens_and_repeated_prompts_prefill_once_per_adapter(
        tiny_engine_factory, lora_adapters):
    # Repeating prompts, so the n-gram drafter proposes; each prompt twice under each adapter and the base.
    prompts = [[1, 504, 2231, 30, 9] * 3, [1, 42, 17, 3003] * 3]
    names = [n for n in NAMES for _ in prompts]
    params = {"temperature": 0, "max_new_tokens": 24}

    def run(engine):
        outs = engine.generate(input_ids=prompts * len(NAMES), sampling_params=params, lora=names)
        return [o.output_ids for o in outs]

    plain = run(tiny_engine_factory(lora_paths=lora_paths(lora_adapters)))
    spec_engine = tiny_engine_factory(lora_paths=lora_paths(lora_adapters), speculative_algorithm="NGRAM")
    speculated = run(spec_engine)
    assert spec_engine.stats()["spec_draft_tokens_total"] > 0
    assert speculated == plain
    assert len({tuple(t) for t in plain[::2]}) == len(NAMES)  # each adapter changes the answer
    # n=2 per (prompt, adapter): one shared prefill each, never one adapter's prompt standing in for another's
    two = tiny_engine_factory(lora_paths=lora_paths(lora_adapters))
    outs = two.generate(input_ids=prompts * len(NAMES), sampling_params={**params, "n": 2}, lora=names)
    assert [o.output_ids for o in outs[::2]] == plain
    assert [o.meta.cached_tokens for o in outs] == [len(p) - 1 for p in prompts * len(NAMES) for _ in range(2)]
    spec_engine.check_invariants()
    two.check_invariants()


def test_an_adapter_in_use_unloads_when_its_request_ends(tiny_engine_factory, lora_adapters):
    engine = tiny_engine_factory(quantization="none", lora_paths=lora_paths(lora_adapters))
    want = engine.generate(input_ids=PROMPTS[0], sampling_params={"temperature": 0, "max_new_tokens": 24},
                           lora="a2").output_ids
    engine.flush_cache()
    stream = engine.stream(input_ids=PROMPTS[0], sampling_params={"temperature": 0, "max_new_tokens": 24,
                                                                  "ignore_eos": True}, lora="a2")
    ids = list(next(stream).token_ids)
    adapter = engine.lora.adapters["a2"]
    engine.unload_lora_adapter("a2")
    with pytest.raises(UnknownAdapter):  # new requests are refused at once...
        engine.prepare(input_ids=PROMPTS[0], lora="a2")
    assert adapter.users == 1 and adapter.slot  # ... while the running one keeps its slot
    for chunk in stream:
        ids += chunk.token_ids
    assert ids[:len(want)] == want
    assert adapter.users == 0 and adapter.slot == 0 and adapter not in engine.lora.slots
    assert engine.stats()["kv_cached_tokens"] == 0  # its finished sequence was not kept either
    engine.check_invariants()


def test_unsupported_adapters_are_refused_naming_what(tmp_path, tiny_engine_factory, lora_adapters):
    def variant(name: str, config: dict | None = None, extra: dict | None = None):
        folder = tmp_path / name
        shutil.copytree(lora_adapters["a0"], folder)
        cfg = json.loads((folder / "adapter_config.json").read_text()) | (config or {})
        (folder / "adapter_config.json").write_text(json.dumps(cfg))
        if extra:
            tensors = load_file(str(folder / "adapter_model.safetensors")) | extra
            save_file(tensors, str(folder / "adapter_model.safetensors"))
        return folder

    with pytest.raises(ValueError, match="DoRA"):
        load_peft_adapter("d", variant("dora", {"use_dora": True}))
    with pytest.raises(ValueError, match="modules_to_save"):
        load_peft_adapter("m", variant("save", {"modules_to_save": ["lm_head"]}))
    with pytest.raises(ValueError, match="norm.lora_A.weight.*not on a supported target"):
        load_peft_adapter("n", variant("norm", extra={"base_model.model.model.norm.lora_A.weight": torch.zeros(4, 64)}))
    with pytest.raises(ValueError, match="lm_head has lora_A only"):
        load_peft_adapter("h", variant("head", extra={"base_model.model.lm_head.lora_A.weight": torch.zeros(4, 64)}))
    with pytest.raises(ValueError, match="no adapter_config.json"):
        load_peft_adapter("x", tmp_path)
    engine = tiny_engine_factory(lora_paths=[f"a0={lora_adapters['a0']}"], max_lora_rank=4)
    with pytest.raises(ValueError, match="rank 8, above max_lora_rank 4"):
        engine.load_lora_adapter("a1", lora_adapters["a1"])
    with pytest.raises(ValueError, match="'a0' is already loaded"):
        engine.load_lora_adapter("a0", lora_adapters["a0"])
    with pytest.raises(UnknownAdapter, match="'a1' is not loaded; loaded: a0"):
        engine.unload_lora_adapter("a1")
    assert engine.lora_adapters() == {"a0": str(lora_adapters["a0"])}  # the engine is as it was
