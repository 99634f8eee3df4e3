"""PEFT as the oracle of multi-LoRA serving: random adapters on the tests' tiny model, written by the installed
peft (adapter_config.json + adapter_model.safetensors), and their greedy tokens under PEFT + transformers."""
from __future__ import annotations

from pathlib import Path

import torch

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# three adapters of different ranks and scalings (rsLoRA's alpha / sqrt(r) on one), every target
ADAPTERS = {"a0": {"r": 4, "lora_alpha": 8}, "a1": {"r": 8, "lora_alpha": 4},
            "a2": {"r": 6, "lora_alpha": 12, "use_rslora": True}}


def write_adapters(base: Path, root: Path, adapters: dict[str, dict] = ADAPTERS) -> dict[str, Path]:
    """Random (init_lora_weights=False: B is not zero) PEFT adapters of `base`, one folder each: each adapter's
    LoraConfig options (target_modules: every linear unless given)."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    out = {}
    for i, (name, options) in enumerate(adapters.items()):
        torch.manual_seed(1000 + i)
        model = get_peft_model(LlamaForCausalLM.from_pretrained(str(base), dtype=torch.float32),
                               LoraConfig(init_lora_weights=False, **{"target_modules": TARGETS} | options))
        model.save_pretrained(str(root / name))
        out[name] = root / name
    return out


def peft_greedy(base: Path, adapter: Path | None, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy tokens of each prompt (one at a time, no padding) under transformers, with the PEFT adapter."""
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, str(adapter))
    outs = []
    with torch.no_grad():
        for ids in prompts:
            out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                                 attention_mask=torch.ones(1, len(ids), dtype=torch.int64))
            outs.append(out[0, len(ids):].tolist())
    return outs
