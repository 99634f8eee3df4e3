"""Mixture-of-experts GGUF files (llama.cpp's layout: Mixtral as `llama` with `expert_count`, `qwen2moe` with
its shared expert, `qwen3moe`, DeepSeek-V2/V3 as `deepseek2`; each layer's experts stacked in
`ffn_{gate,up,down}_exps`, its router in `ffn_gate_inp`) written by the gguf package from a tiny transformers
checkpoint give transformers' greedy tokens (DeepSeek's also its top-5 logprobs)."""
from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
import torch

from radixlang.runtime.engine import Engine

from .gguf_tiny import (
    GGUF_ARCH,
    add_base_metadata,
    byte_tokenizer_metadata,
    gguf_name,
    permute_qk,
    write_gguf,
    write_out,
)
from .hf_tiny import one_thread
from .test_hf_parity import full_logprobs, hf_greedy
from .test_moe_parity import PARITY_GAIN, TOP5_TOLERANCE, build, prompts, top5_error

pytestmark = pytest.mark.usefixtures(one_thread.__name__)  # the fixture, imported

EXPERT_STEMS = {"gate": "ffn_gate_exps", "up": "ffn_up_exps", "down": "ffn_down_exps"}
SHARED_STEMS = {"gate_proj": "ffn_gate_shexp", "up_proj": "ffn_up_shexp", "down_proj": "ffn_down_shexp"}


def moe_gguf_tensors(model, hf: dict) -> dict[str, tuple[np.ndarray, None]]:
    """What llama.cpp's converter writes (fp32): Llama-family Q/K rows permuted, experts stacked per layer."""
    permuted = GGUF_ARCH[hf["architectures"][0]] == "llama"
    heads = {"q_proj": hf["num_attention_heads"], "k_proj": hf["num_key_value_heads"]}
    tensors = {}
    for name, w in model.state_dict().items():
        w = w.float().numpy()
        parts = name.removeprefix("model.").split(".")
        if "experts" in parts:  # transformers 5 holds them stacked: gate_up_proj [E, 2I, H], down_proj [E, H, I]
            layer = parts[1]
            if parts[-1] == "gate_up_proj":
                gate, up = np.split(w, 2, axis=1)
                tensors[f"blk.{layer}.{EXPERT_STEMS['gate']}.weight"] = (gate, None)
                tensors[f"blk.{layer}.{EXPERT_STEMS['up']}.weight"] = (up, None)
            else:
                tensors[f"blk.{layer}.{EXPERT_STEMS['down']}.weight"] = (w, None)
            continue
        if parts[-2:] == ["gate", "weight"]:
            tensors[f"blk.{parts[1]}.ffn_gate_inp.weight"] = (w, None)
            continue
        if "shared_expert" in parts:  # Qwen2-MoE
            tensors[f"blk.{parts[1]}.{SHARED_STEMS[parts[-2]]}.weight"] = (w, None)
            continue
        if parts[-2] == "shared_expert_gate":  # llama.cpp writes its one row as a vector
            tensors[f"blk.{parts[1]}.ffn_gate_inp_shexp.weight"] = (w[0], None)
            continue
        if permuted and parts[-2] in heads:
            w = permute_qk(w, heads[parts[-2]])
        tensors[gguf_name(name)] = (np.ascontiguousarray(w), None)
    return tensors


@pytest.mark.parametrize("name", ["mixtral", "qwen2-moe", "qwen3-moe"])  # qwen2-moe: layer 0 dense
def test_moe_gguf_gives_transformers_greedy_tokens(tmp_path, name):
    model = build(tmp_path, name)
    hf = json.loads((tmp_path / name / "config.json").read_text())
    path = tmp_path / f"{name}.gguf"
    write_gguf(path, hf, moe_gguf_tensors(model, hf))
    batch = prompts(len(name))[:2]
    expected = [hf_greedy(model, ids, 8) for ids in batch]
    with Engine(str(path), device="cpu", kv_cache_tokens=512) as engine:
        got = engine.generate(input_ids=batch, sampling_params={"max_new_tokens": 8, "temperature": 0,
                                                                "ignore_eos": True})
        engine.check_invariants()
        routed = engine.expert_load()
    assert [o.output_ids for o in got] == expected
    assert routed.shape[1] == hf.get("num_local_experts", hf.get("num_experts")) and routed.sum() > 0


def write_deepseek_gguf(path, model, hf: dict, split_kv_b: bool) -> None:
    """What llama.cpp's converter writes for a DeepSeek-V2/V3 checkpoint (`deepseek2`, fp32; tensor names from
    gguf's own map): MLA as MQA over the latent, kv_b_proj split per head into W_UK^T and W_UV; with
    `split_kv_b` False, as files written before that split (kv_b whole, no *_mla lengths, no gating key)."""
    arch, blocks = gguf.MODEL_ARCH.DEEPSEEK2, hf["num_hidden_layers"]
    nope, rope, v_dim, rank = hf["qk_nope_head_dim"], hf["qk_rope_head_dim"], hf["v_head_dim"], hf["kv_lora_rank"]
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    add_base_metadata(w, hf, kv_heads=1)  # MLA as MQA over the latent
    w.add_leading_dense_block_count(hf["first_k_dense_replace"])
    if hf["q_lora_rank"] is not None:
        w.add_q_lora_rank(hf["q_lora_rank"])
    w.add_kv_lora_rank(rank)
    if split_kv_b:
        w.add_key_length(rank + rope)
        w.add_value_length(rank)
        w.add_key_length_mla(nope + rope)
        w.add_value_length_mla(v_dim)
        v3 = hf["architectures"] == ["DeepseekV3ForCausalLM"]  # hub configs say scoring_func; V3 is sigmoid
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if v3 else gguf.ExpertGatingFuncType.SOFTMAX)
    else:
        w.add_key_length(nope + rope)
        w.add_value_length(v_dim)
    w.add_expert_feed_forward_length(hf["moe_intermediate_size"])
    w.add_expert_count(hf["n_routed_experts"])
    w.add_expert_used_count(hf["num_experts_per_tok"])
    w.add_expert_shared_count(hf["n_shared_experts"])
    w.add_expert_weights_scale(hf["routed_scaling_factor"])
    w.add_expert_weights_norm(hf["norm_topk_prob"])
    w.add_expert_group_count(hf["n_group"])
    w.add_expert_group_used_count(hf["topk_group"])
    w.add_rope_dimension_count(rope)
    scaling = hf["rope_parameters"]
    if scaling["rope_type"] == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(scaling["factor"])
        w.add_rope_scaling_orig_ctx_len(scaling["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_log_mul(0.1 * scaling["mscale_all_dim"])
    byte_tokenizer_metadata(w)
    names = gguf.get_tensor_name_map(arch, blocks)
    for name, t in deepseek_tensors(model, hf, split_kv_b):
        w.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")), np.ascontiguousarray(t.numpy()))
    write_out(w)


def deepseek_tensors(model, hf: dict, split_kv_b: bool):
    """The checkpoint's tensors under the HF names llama.cpp's converter maps: experts stacked per layer,
    the router bias as `e_score_correction.bias`, kv_b_proj as k_b_proj (transposed) and v_b_proj."""
    heads, nope, v_dim = hf["num_attention_heads"], hf["qk_nope_head_dim"], hf["v_head_dim"]
    for name, t in model.state_dict().items():
        t = t.float()
        if name.endswith("experts.gate_up_proj"):  # transformers 5 holds experts stacked: [E, 2I, H]
            gate, up = t.chunk(2, dim=1)
            yield name.replace("gate_up_proj", "gate_proj.weight"), gate
            yield name.replace("gate_up_proj", "up_proj.weight"), up
        elif name.endswith("experts.down_proj"):
            yield name + ".weight", t
        elif name.endswith("e_score_correction_bias"):
            yield name.replace("e_score_correction_bias", "e_score_correction.bias"), t
        elif name.endswith("kv_b_proj.weight") and split_kv_b:
            k_b, v_b = t.view(heads, nope + v_dim, -1).split([nope, v_dim], dim=1)
            yield name.replace("kv_b_proj", "k_b_proj"), k_b.transpose(1, 2)
            yield name.replace("kv_b_proj", "v_b_proj"), v_b
        else:
            yield name, t


@pytest.mark.parametrize("name, split_kv_b", [("deepseek-v2", False), ("deepseek-v3", True)])
def test_deepseek_gguf_gives_transformers_tokens_and_logprobs(tmp_path, name, split_kv_b):
    """llama.cpp's `deepseek2` files (V2 as written before kv_b was split, V3 as now) load as DeepSeek with MLA,
    grouped routing (V3: sigmoid with the aux-loss-free bias) and YaRN, and score as transformers does."""
    model = build(tmp_path, name, PARITY_GAIN)
    hf = json.loads((tmp_path / name / "config.json").read_text())
    path = tmp_path / f"{name}.gguf"
    write_deepseek_gguf(path, model, hf, split_kv_b)
    batch = prompts(len(name))[:2]
    expected = [hf_greedy(model, ids, 8) for ids in batch]
    with Engine(str(path), device="cpu", kv_cache_tokens=512) as engine:
        got = engine.generate(input_ids=batch, sampling_params={"max_new_tokens": 8, "temperature": 0,
                                                                "ignore_eos": True})
        scored = engine.generate(input_ids=batch[0], sampling_params={"max_new_tokens": 1}, return_logprob=True,
                                 logprob_start_len=0, top_logprobs_num=5)
        engine.check_invariants()
    assert [o.output_ids for o in got] == expected
    with torch.no_grad():
        top = torch.log_softmax(model(torch.tensor([batch[0]])).logits[0], -1).topk(5, dim=-1)
    ours = full_logprobs(scored.meta)
    assert torch.equal(ours.nan_to_num(float("-inf")).topk(5, dim=-1).indices.sort(-1)[0], top.indices.sort(-1)[0])
    assert top5_error(model, batch[0], ours, top) < TOP5_TOLERANCE
