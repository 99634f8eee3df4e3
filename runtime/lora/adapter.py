"""A LoRA adapter read from a PEFT folder: `adapter_config.json` + `adapter_model.safetensors` (or .bin).

PEFT's layer computes y = W x + (alpha / r) B A x (`use_rslora`: alpha / sqrt(r)), with A [r, in] and B [out, r]
stored as `...layers.{i}.{module}.lora_A.weight` / `lora_B.weight`. The targets served are the Llama family's
seven linears (q, k, v, o, gate, up, down); anything else an adapter asks for (DoRA, biases, embeddings or the LM
head, per-module rank patterns, extra trained modules) is refused with a ValueError naming it, rather than served
wrong.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_KEY = re.compile(r"(?:.*\.)?layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.\w+)?\.weight$")
# config fields that ask for more than plain LoRA on linears, and what each is
_UNSUPPORTED = {
    "use_dora": "DoRA (use_dora)",
    "modules_to_save": "trained extra modules (modules_to_save)",
    "rank_pattern": "per-module ranks (rank_pattern)",
    "alpha_pattern": "per-module alphas (alpha_pattern)",
    "layer_replication": "layer replication (layer_replication)",
    "lora_bias": "LoRA biases (lora_bias)",
    "trainable_token_indices": "trainable token embeddings (trainable_token_indices)",
    "fan_in_fan_out": "transposed (Conv1D) weights (fan_in_fan_out)",
    "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens)",
    "target_parameters": "LoRA on parameters (target_parameters)",
    "use_qalora": "QALoRA (use_qalora)",
    "use_bdlora": "block-diagonal LoRA (use_bdlora)",
}


@dataclass(slots=True)
class LoraAdapter:
    """One loaded adapter: A and B per (layer, target), B already scaled, on the CPU (the slot pool copies the
    active ones to the device)."""

    name: str
    path: str
    rank: int
    scaling: float
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]  # (layer, target) -> (A [r, in], B*s [out, r])
    uid: int = 0  # set by the registry: a reloaded name is a new adapter (its KV namespace differs)
    users: int = 0  # live requests that run it (scheduler thread)
    retired: bool = False  # unloaded: it frees once its last request ends
    slot: int = 0  # its slot in the device pool (0: none yet)
    last_used: int = 0  # the step that last ran it (slot eviction picks the oldest)

    @property
    def key(self) -> str:
        """Its KV namespace value: unique per load, so a reloaded name never reuses the old weights' KV."""
        return f"{self.name}#{self.uid}"


def load_peft_adapter(name: str, path: str | Path) -> LoraAdapter:
    """Reads a PEFT LoRA folder; ValueError naming what is missing or unsupported."""
    folder = Path(path)
    config_file = folder / "adapter_config.json"
    if not config_file.is_file():
        raise ValueError(f"LoRA adapter {name!r}: {folder} has no adapter_config.json (a PEFT adapter folder)")
    cfg = json.loads(config_file.read_text())
    _check_config(name, cfg)
    rank, alpha = int(cfg["r"]), float(cfg.get("lora_alpha", cfg["r"]))
    scaling = alpha / math.sqrt(rank) if cfg.get("use_rslora") else alpha / rank
    tensors = _read_tensors(name, folder)
    parts: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _KEY.match(key)
        if match is None or match.group(2) not in TARGETS:
            raise ValueError(f"LoRA adapter {name!r}: weight {key!r} is not on a supported target; radixlang serves "
                             f"LoRA on {', '.join(TARGETS)} (not embeddings or the LM head)")
        parts.setdefault((int(match.group(1)), match.group(2)), {})[match.group(3)] = tensor
    if not parts:
        raise ValueError(f"LoRA adapter {name!r}: {folder} holds no LoRA weights")
    weights = {}
    for (layer, target), ab in sorted(parts.items()):
        if set(ab) != {"A", "B"}:
            raise ValueError(f"LoRA adapter {name!r}: layer {layer} {target} has lora_{''.join(ab)} only")
        a, b = ab["A"].float(), ab["B"].float()
        if a.shape[0] != rank or b.shape[1] != rank:
            raise ValueError(f"LoRA adapter {name!r}: layer {layer} {target} has rank {a.shape[0]}, config r={rank}")
        weights[(layer, target)] = (a.contiguous(), (b * scaling).contiguous())
    return LoraAdapter(name, str(folder), rank, scaling, weights)


def _check_config(name: str, cfg: dict) -> None:
    if cfg.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"LoRA adapter {name!r}: peft_type {cfg.get('peft_type')!r} is not LORA")
    if "r" not in cfg:
        raise ValueError(f"LoRA adapter {name!r}: adapter_config.json has no rank 'r'")
    if cfg.get("bias", "none") != "none":
        raise ValueError(f"LoRA adapter {name!r}: trained biases (bias={cfg['bias']!r}) are not supported")
    for key, what in _UNSUPPORTED.items():
        if cfg.get(key):
            raise ValueError(f"LoRA adapter {name!r}: {what} is not supported")


def _read_tensors(name: str, folder: Path) -> dict[str, torch.Tensor]:
    st, pt = folder / "adapter_model.safetensors", folder / "adapter_model.bin"
    if st.is_file():
        from safetensors.torch import load_file

        return load_file(str(st))
    if pt.is_file():
        return torch.load(str(pt), map_location="cpu", weights_only=True)
    raise ValueError(f"LoRA adapter {name!r}: {folder} has no adapter_model.safetensors")
