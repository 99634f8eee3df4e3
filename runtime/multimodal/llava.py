"""LLaVA (LlavaForConditionalGeneration): a CLIP or SigLIP tower, a selected feature layer (or several,
concatenated), and a two-layer MLP projector into the Llama-family language model's embedding space."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from .vision import VisionConfig, VisionTower

LLAVA = "LlavaForConditionalGeneration"
# transformers' LlavaConfig defaults for a vision_config it leaves out (a CLIP ViT-L/14 at 336 px), and
# LlamaConfig's for the text_config fields real folders leave out (e.g. llava-1.5-7b-hf's)
LLAVA_VISION_DEFAULTS = dict(model_type="clip_vision_model", intermediate_size=4096, hidden_size=1024, patch_size=14,
                             image_size=336, num_hidden_layers=24, num_attention_heads=16)
_LLAMA_DEFAULTS = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                       num_attention_heads=32, max_position_embeddings=2048, rms_norm_eps=1e-6)
_PROJECTOR_ACTS = {"gelu": F.gelu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu}


@dataclass(frozen=True, slots=True)
class LlavaConfig:
    vision: VisionConfig
    text_hidden_size: int
    image_token_id: int
    feature_layers: tuple[int, ...]  # hidden-state indices (negative: from the end), concatenated
    select_strategy: str  # "default": drop the class token; "full": keep every position
    projector_act: str = "gelu"
    projector_bias: bool = True

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "LlavaConfig":
        vision = VisionConfig.from_hf(LLAVA_VISION_DEFAULTS | (hf.get("vision_config") or {}))
        layer = hf.get("vision_feature_layer", -2)
        layers = (layer,) if isinstance(layer, int) else tuple(layer)
        strategy = hf.get("vision_feature_select_strategy", "default")
        if strategy not in ("default", "full"):
            raise ValueError(f"vision_feature_select_strategy must be 'default' or 'full', got {strategy!r}")
        if strategy == "default" and not vision.has_class_token:
            raise ValueError("vision_feature_select_strategy 'default' drops a class token this tower lacks")
        n = vision.num_layers + 1
        if not layers or not all(isinstance(i, int) and -n <= i < n for i in layers):
            raise ValueError(f"vision_feature_layer must be hidden-state indices in [{-n}, {n}), got {layer!r}")
        act = hf.get("projector_hidden_act", "gelu")
        if act not in _PROJECTOR_ACTS:
            raise ValueError(f"projector_hidden_act {act!r} is not supported ({sorted(_PROJECTOR_ACTS)} are)")
        token = hf.get("image_token_id", hf.get("image_token_index", 32000))
        return cls(vision, llava_text_config(hf)["hidden_size"], token, layers, strategy, act,
                   bool(hf.get("multimodal_projector_bias", True)))

    @property
    def tokens_per_image(self) -> int:
        cls_token = int(self.vision.has_class_token and self.select_strategy == "full")
        return self.vision.num_patches + cls_token


def llava_text_config(hf: dict[str, Any]) -> dict[str, Any]:
    """The language model's config.json, as a text-only Llama folder would hold it."""
    text = dict(hf.get("text_config") or {})
    if text.get("model_type", "llama") != "llama":
        raise ValueError(f"text_config.model_type {text.get('model_type')!r} is not supported; "
                         "LLaVA folders need a Llama-family language model")
    return {"architectures": ["LlamaForCausalLM"], "tie_word_embeddings": hf.get("tie_word_embeddings", False),
            **_LLAMA_DEFAULTS, **text}


class LlavaProjector(nn.Module):
    def __init__(self, cfg: LlavaConfig):
        super().__init__()
        d_in = cfg.vision.hidden_size * len(cfg.feature_layers)
        self.linear_1 = nn.Linear(d_in, cfg.text_hidden_size, bias=cfg.projector_bias)
        self.linear_2 = nn.Linear(cfg.text_hidden_size, cfg.text_hidden_size, bias=cfg.projector_bias)
        self.act = _PROJECTOR_ACTS[cfg.projector_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


class LlavaVision(nn.Module):
    """Pixels [B, 3, H, W] -> image features [B, tokens_per_image, text hidden size]."""

    def __init__(self, cfg: LlavaConfig):
        super().__init__()
        self.config = cfg
        self.vision_tower = VisionTower(cfg.vision)
        self.multi_modal_projector = LlavaProjector(cfg)

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        """One image's [3, H, W] pixels -> its [tokens_per_image, hidden] features."""
        return self(pixels.unsqueeze(0))[0]

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        n = self.config.vision.num_layers + 1
        wanted = [i % n for i in self.config.feature_layers]
        states = self.vision_tower.hidden_states(pixels, max(wanted))
        picked = [states[i] for i in wanted]
        if self.config.select_strategy == "default":
            picked = [s[:, 1:] for s in picked]
        return self.multi_modal_projector(torch.cat(picked, dim=-1))

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_exact(self, weights)


def load_exact(module: nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copies each named tensor into the module's parameter of that name; every parameter must come."""
    params = dict(module.named_parameters())
    loaded = set()
    for name, tensor in weights:
        if name not in params:
            raise ValueError(f"unexpected vision weight {name!r}")
        if tuple(params[name].shape) != tuple(tensor.shape):
            raise ValueError(f"vision weight {name!r} has shape {tuple(tensor.shape)}, "
                             f"expected {tuple(params[name].shape)}")
        params[name].copy_(tensor.to(params[name].dtype))
        loaded.add(name)
    missing = sorted(set(params) - loaded)
    if missing:
        raise ValueError(f"checkpoint is missing vision weights: {missing[:5]}")


def split_llava_weights(weights: Iterable[tuple[str, torch.Tensor]]):
    """HF LLaVA tensor names, in either layout transformers has saved, -> (language model, vision) pairs."""
    text, vision = [], []
    for name, tensor in weights:
        name = name.removeprefix("model.")
        if name.startswith("language_model."):
            text.append((name.removeprefix("language_model."), tensor))
        elif name == "lm_head.weight":
            text.append((name, tensor))
        elif name.startswith("vision_tower."):
            stem = name.removeprefix("vision_tower.").removeprefix("vision_model.")
            if not stem.startswith("head."):  # SigLIP's pooling head: LLaVA reads hidden states only
                vision.append(("vision_tower." + stem, tensor))
        elif name.startswith("multi_modal_projector."):
            vision.append((name, tensor))
        else:
            raise ValueError(f"unexpected LLaVA weight {name!r}")
    return text, vision
