"""Each supported family, saved by transformers, runs in the engine with transformers' own logits and greedy tokens."""
from __future__ import annotations

import copy

import pytest
import torch
import transformers  # noqa: E402

from radixlang.runtime.engine import Engine  # noqa: E402

from .hf_tiny import BASE, VOCAB_SIZE, save_hf_model  # noqa: E402

LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 32}
# name -> (config class, overrides); original contexts of 32 put the prompts' positions past them
FAMILIES = {
    "llama2": ("LlamaConfig", dict(num_key_value_heads=4)),
    "llama3": ("LlamaConfig", dict(rope_theta=500000.0)),
    "llama3.1": ("LlamaConfig", dict(rope_theta=500000.0, rope_scaling=LLAMA3_SCALING)),
    "llama3.2-tied": ("LlamaConfig", dict(rope_theta=500000.0, tie_word_embeddings=True,
                                          rope_scaling=LLAMA3_SCALING | {"factor": 32.0})),
    "llama-biases": ("LlamaConfig", dict(attention_bias=True, mlp_bias=True)),
    "llama-linear": ("LlamaConfig", dict(rope_scaling={"rope_type": "linear", "factor": 4.0})),
    "llama-dynamic": ("LlamaConfig", dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0})),
    "llama-yarn": ("LlamaConfig", dict(rope_scaling={"rope_type": "yarn", "factor": 8.0,
                                                      "original_max_position_embeddings": 32})),
    "qwen2": ("Qwen2Config", dict(rope_theta=1000000.0, tie_word_embeddings=True)),
    "qwen2.5-yarn": ("Qwen2Config", dict(rope_theta=1000000.0, rope_scaling={
        "type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32})),
    "qwen3": ("Qwen3Config", dict(rope_theta=1000000.0, head_dim=32, tie_word_embeddings=True)),
    "qwen3-bias": ("Qwen3Config", dict(head_dim=24, attention_bias=True)),
    "mistral": ("MistralConfig", dict(rope_theta=1000000.0, sliding_window=None)),
    "mistral-window": ("MistralConfig", dict(sliding_window=128)),  # wider than prompt + output
}
PROMPT_LENGTHS = (70, 45, 9)
NEW_TOKENS = 16


def build(tmp_path, name: str):
    cls_name, overrides = FAMILIES[name]
    config = getattr(transformers, cls_name)(**(BASE | overrides))
    return save_hf_model(tmp_path / name, config, seed=len(name))


def prompts(seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]


@torch.no_grad()
def hf_greedy(model, ids: list[int], steps: int) -> list[int]:
    out = list(ids)
    for _ in range(steps):
        out.append(int(model(torch.tensor([out])).logits[0, -1].argmax()))
    return out[len(ids):]


def full_logprobs(completion_meta) -> torch.Tensor:
    """[positions, vocab] log-probs from an engine run asked for every token's logprob at every position."""
    rows = []
    for lp in completion_meta.input_logprobs + completion_meta.output_logprobs:
        row = torch.full((VOCAB_SIZE,), float("nan"))
        for token_id, logprob in lp.top:
            row[token_id] = logprob
        rows.append(row)
    return torch.stack(rows)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_engine_matches_transformers_logits_and_greedy_tokens(tmp_path, name):
    model = build(tmp_path, name)
    batch = prompts(len(name))
    expected = [hf_greedy(model, ids, NEW_TOKENS) for ids in batch]
    # the continuations are varied, so equal tokens are a sharp test
    assert all(len(set(seq)) >= 4 for seq in expected)
    with Engine(str(tmp_path / name), device="cpu", kv_cache_tokens=1024, max_prefill_tokens=48) as engine:
        greedy = engine.generate(input_ids=batch, sampling_params={
            "max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True})
        scored = engine.generate(input_ids=batch[0], sampling_params={"max_new_tokens": 1}, return_logprob=True,
                                 logprob_start_len=0, top_logprobs_num=VOCAB_SIZE)
        engine.check_invariants()
    assert [out.output_ids for out in greedy] == expected
    with torch.no_grad():
        ref = torch.log_softmax(model(torch.tensor([batch[0]])).logits[0], -1)
        exact = torch.log_softmax(copy.deepcopy(model).double()(torch.tensor([batch[0]])).logits[0], -1)
    got = full_logprobs(scored.meta)
    assert got.shape == ref.shape and not got.isnan().any()
    # against fp64 transformers, within twice fp32 transformers' own error (measured 0.75-1.6x it across the families): the engine's attention sums in
    # an order of its own (kernels/cpu attention_rows), so its fp32 rounding is not transformers' SDPA's
    own = (ref.double() - exact).abs().max()
    print(f"{name}: max |logprob diff| {(got - exact).abs().max():.2e} from fp64 (fp32 transformers: {own:.2e})")
    assert (got.double() - exact).abs().max() < max(3e-4, 2 * own)
