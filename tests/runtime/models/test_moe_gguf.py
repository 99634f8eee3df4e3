"""Mixture-of-experts GGUF files (llama.cpp's layout: Mixtral as `llama` with `expert_count`, `qwen2moe` with
its shared expert, `qwen3moe`; each
layer's experts stacked in `ffn_{gate,up,down}_exps`, its router in `ffn_gate_inp`) written by the gguf
package from a tiny transformers checkpoint give transformers' greedy tokens."""
from __future__ import annotations

import json

import numpy as np
import pytest

from radixlang.runtime.engine import Engine

from .gguf_tiny import GGUF_ARCH, gguf_name, permute_qk, write_gguf
from .hf_tiny import one_thread
from .test_hf_parity import hf_greedy
from .test_moe_parity import build, prompts

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
