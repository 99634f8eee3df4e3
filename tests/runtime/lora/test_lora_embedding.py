"""LoRA on the token embedding and the LM head (PEFT's `embed_tokens` Embedding and `lm_head` Linear targets),
against PEFT + transformers on the same weights (tests/lora_peft.py):

- the exact mode: one batch mixing adapters with an embedding and / or a head delta, an adapter of the linears
  only, and the base gives each request PEFT's greedy tokens, on an untied model and on a tied one (the head's
  delta then rides on the embedding's weights, as PEFT's does, with or without `ensure_weight_tying`);
- the default mode: each adapter's tokens are the same alone and mixed;
- an adapter of another vocabulary is refused naming the shapes.
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from radixlang.kernels.lora import native_available
from radixlang.runtime.lora.adapter import load_peft_adapter
from tests.conftest import TINY_CONFIG, tiny_weights, write_hf_folder
from tests.lora_peft import peft_greedy, write_adapters

PROMPTS = [[1, 504, 2231, 30, 9, 712, 88], [1, 42, 17, 3003, 41000, 615, 2048, 77, 9, 5, 61]]
NEW = 8
GREEDY = {"temperature": 0, "max_new_tokens": NEW}
# an embedding with some linears and the head; the embedding alone (rsLoRA); the head alone (a large scaling: the
# tiny model's wide head makes logits gaps that PEFT's default-initialized head LoRA would not cross)
ADAPTERS = {"e0": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj", "embed_tokens", "lm_head"]},
            "e1": {"r": 8, "lora_alpha": 4, "use_rslora": True, "target_modules": ["embed_tokens"]},
            "h0": {"r": 6, "lora_alpha": 384, "target_modules": ["lm_head"]}}
TIED = {"t0": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "embed_tokens", "lm_head"]},
        "t1": {"r": 4, "lora_alpha": 2, "target_modules": ["embed_tokens", "lm_head"], "ensure_weight_tying": True}}


@pytest.fixture(scope="module")
def emb_adapters(tmp_path_factory, tiny_model_dir, lora_adapters) -> dict[str, object]:
    return write_adapters(tiny_model_dir, tmp_path_factory.mktemp("lora-emb"), ADAPTERS) | {"a0": lora_adapters["a0"]}


@pytest.fixture(scope="module")
def tied_model(tmp_path_factory, tokenizer):
    """The tiny model with its LM head tied to the embedding (SmolLM2's layout), and two adapters of it."""
    weights = tiny_weights(TINY_CONFIG)
    del weights["lm_head.weight"]
    folder = write_hf_folder(tmp_path_factory.mktemp("tiny-tied"), TINY_CONFIG | {"tie_word_embeddings": True},
                             weights, tokenizer)
    return folder, write_adapters(folder, tmp_path_factory.mktemp("lora-tied"), TIED)


def run_mixed(engine, names) -> dict:
    """Every prompt under every adapter (None: the base) in one call: admitted together, one batch."""
    outs = engine.generate(input_ids=[p for _ in names for p in PROMPTS], sampling_params=GREEDY,
                           lora=[n for n in names for _ in PROMPTS])
    return {n: [o.output_ids for o in outs[i * len(PROMPTS):(i + 1) * len(PROMPTS)]] for i, n in enumerate(names)}


def paths(adapters) -> list[str]:
    return [f"{name}={path}" for name, path in adapters.items()]


def test_embedding_and_head_deltas_mixed_with_linears_only_and_the_base_equal_peft(tiny_engine_factory,
                                                                                tiny_model_dir, emb_adapters):
    names = [None, "a0", "e0", "e1", "h0"]
    want = {n: peft_greedy(tiny_model_dir, None if n is None else emb_adapters[n], PROMPTS, NEW) for n in names}
    assert len({tuple(t[0]) for t in want.values()}) == len(names)  # each adapter changes the answer
    engine = tiny_engine_factory(quantization="none", lora_paths=paths(emb_adapters))
    assert run_mixed(engine, names) == want
    assert engine.lora.whole["embed_tokens"].a.dtype == torch.float32  # PEFT's weights, as they are


def test_a_tied_models_embedding_and_head_adapters_equal_peft(tiny_engine_factory, tied_model):
    folder, adapters = tied_model
    names = [None, "t0", "t1"]
    want = {n: peft_greedy(folder, None if n is None else adapters[n], PROMPTS, NEW) for n in names}
    assert len({tuple(t[0]) for t in want.values()}) == len(names)
    engine = tiny_engine_factory(model=str(folder), quantization="none", lora_paths=paths(adapters))
    assert run_mixed(engine, names) == want


def test_default_mode_tokens_are_the_same_alone_and_mixed(tiny_engine_factory, emb_adapters):
    names = [None, "a0", "e0", "e1", "h0"]
    engine = tiny_engine_factory(lora_paths=paths(emb_adapters), max_loras_per_batch=3)
    alone = {n: [engine.generate(input_ids=p, sampling_params=GREEDY, lora=n).output_ids for p in PROMPTS]
             for n in names}
    if native_available():  # the head runs as the linears do: the native kernel, on int8 weights
        assert engine.lora.whole["lm_head"].a.dtype == torch.int8
    engine.flush_cache()
    assert run_mixed(engine, names) == alone  # 4 adapters on 3 slots: slots are reused
    assert run_mixed(engine, names[::-1]) == alone


def test_an_adapter_of_another_vocabulary_is_refused(tmp_path, tiny_engine_factory, emb_adapters):
    folder = tmp_path / "resized"
    shutil.copytree(emb_adapters["e0"], folder)
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    key = "base_model.model.model.embed_tokens.base_layer.weight"  # PEFT's copy of the base: 8 tokens added
    tensors[key] = torch.cat([tensors[key], tensors[key][:8]])
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    engine = tiny_engine_factory(lora_paths=paths({"a0": emb_adapters["a0"]}), max_lora_rank=8)
    with pytest.raises(ValueError, match=r"embed_tokens of shape \[49160, 64\], the model's is \[49152, 64\]"):
        engine.load_lora_adapter("resized", folder)
    cfg = json.loads((folder / "adapter_config.json").read_text()) | {"trainable_token_indices": [5, 6]}
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="trainable token embeddings"):
        load_peft_adapter("tokens", folder)
    assert engine.lora_adapters() == {"a0": str(emb_adapters["a0"])}
