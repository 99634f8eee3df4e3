"""A LoRA adapter read from a PEFT folder: `adapter_config.json` + `adapter_model.safetensors` (or .bin).

PEFT's layer computes y = W x + (alpha / r) B A x (`use_rslora`: alpha / sqrt(r)), with A [r, in] and B [out, r]
stored as `...layers.{i}.{module}.lora_A.weight` / `lora_B.weight`. The targets served are the Llama family's
seven linears (q, k, v, o, gate, up, down), the token embedding (PEFT's `Embedding` layer: `embed_tokens.
lora_embedding_A` [r, vocab] and `lora_embedding_B` [hidden, r]; token t adds (alpha / r) B A[:, t]) and the LM
head (a Linear: `lm_head.lora_A.weight` [r, hidden], `lora_B.weight` [vocab, r]). Anything else an adapter asks
for (DoRA, biases, per-module rank patterns, extra trained modules or tokens) is refused with a ValueError naming
it, rather than served wrong.

PEFT saves a copy of the base embedding and LM head beside their LoRA weights (`...embed_tokens.base_layer.weight`,
`save_embedding_layers`, so that a resized vocabulary survives); the engine serves its own base weights, so a copy
must have the model's shape and is otherwise not read. A tied model's `ensure_weight_tying` adapter stores the LM
head's A and B (the embedding's B^T and A^T), which serve as any LM head LoRA.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_KEY = re.compile(r"(?:.*\.)?layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.\w+)?\.weight$")
_EMBEDDING = re.compile(r"(?:.*\.)?embed_tokens\.lora_embedding_([AB])(?:\.\w+)?$")
_HEAD = re.compile(r"(?:.*\.)?lm_head\.lora_([AB])(?:\.\w+)?\.weight$")
_BASE_COPY = re.compile(r"(?:.*\.)?(embed_tokens|lm_head)\.base_layer\.weight$")  # save_embedding_layers' copy
EMBEDDING, HEAD = "embed_tokens", "lm_head"  # the weights' keys of the two whole-model targets (layer -1)
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
    # (layer, target) -> (A [r, in], B*s [out, r]); the embedding and the LM head at (-1, EMBEDDING / HEAD), the
    # embedding's A [r, vocab] (a column per token) and B*s [hidden, r]
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]
    base_copies: dict[str, tuple[int, ...]] = field(default_factory=dict)  # PEFT's copies of the base: their shapes
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
    tensors, base_copies = _read_tensors(name, folder)
    parts: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        place, part = _place(key)
        if place is None:
            raise ValueError(f"LoRA adapter {name!r}: weight {key!r} is not on a supported target; radixlang serves "
                             f"LoRA on {', '.join(TARGETS)}, {EMBEDDING} and {HEAD}")
        parts.setdefault(place, {})[part] = tensor
    if not parts:
        raise ValueError(f"LoRA adapter {name!r}: {folder} holds no LoRA weights")
    weights = {}
    for (layer, target), ab in sorted(parts.items()):
        if set(ab) != {"A", "B"}:
            raise ValueError(f"LoRA adapter {name!r}: {_where(layer, target)} has lora_{''.join(ab)} only")
        a, b = ab["A"].float(), ab["B"].float()
        if a.shape[0] != rank or b.shape[1] != rank:
            raise ValueError(f"LoRA adapter {name!r}: {_where(layer, target)} has rank {a.shape[0]}, config r={rank}")
        weights[(layer, target)] = (a.contiguous(), (b * scaling).contiguous())
    return LoraAdapter(name, str(folder), rank, scaling, weights, base_copies)


def _place(key: str) -> tuple[tuple[int, str] | None, str]:
    """(layer, target) and "A" / "B" of a LoRA weight's key; (None, "") for a key on no served target."""
    if (match := _KEY.match(key)) and match.group(2) in TARGETS:
        return (int(match.group(1)), match.group(2)), match.group(3)
    if match := _EMBEDDING.match(key):
        return (-1, EMBEDDING), match.group(1)
    if match := _HEAD.match(key):
        return (-1, HEAD), match.group(1)
    return None, ""


def _where(layer: int, target: str) -> str:
    return target if layer < 0 else f"layer {layer} {target}"


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


def _read_tensors(name: str, folder: Path) -> tuple[dict[str, torch.Tensor], dict[str, tuple[int, ...]]]:
    """The LoRA weights, and the shapes of PEFT's copies of the base embedding / LM head by target (never read from
    a safetensors file: a large model's are gigabytes)."""
    st, pt = folder / "adapter_model.safetensors", folder / "adapter_model.bin"
    tensors: dict[str, torch.Tensor] = {}
    copies: dict[str, tuple[int, ...]] = {}
    if st.is_file():
        from safetensors import safe_open

        with safe_open(str(st), framework="pt") as f:
            for key in f.keys():
                if copy := _BASE_COPY.match(key):
                    copies[copy.group(1)] = tuple(f.get_slice(key).get_shape())
                else:
                    tensors[key] = f.get_tensor(key)
        return tensors, copies
    if pt.is_file():
        for key, tensor in torch.load(str(pt), map_location="cpu", weights_only=True).items():
            if copy := _BASE_COPY.match(key):
                copies[copy.group(1)] = tuple(tensor.shape)
            else:
                tensors[key] = tensor
        return tensors, copies
    raise ValueError(f"LoRA adapter {name!r}: {folder} has no adapter_model.safetensors")
