"""ViT vision towers (CLIP and SigLIP) that return the hidden states of every layer, so a model can pick
its feature layer. Weight names follow transformers' CLIPVisionModel / SiglipVisionModel."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

CLIP, SIGLIP, IDEFICS3 = "clip_vision_model", "siglip_vision_model", "idefics3_vision"
# transformers' defaults for fields a config.json leaves out (real LLaVA folders are sparse)
_DEFAULTS: dict[str, dict[str, Any]] = {
    CLIP: dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12, image_size=224,
               patch_size=32, layer_norm_eps=1e-5, hidden_act="quick_gelu"),
    SIGLIP: dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                 image_size=224, patch_size=16, layer_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh"),
    IDEFICS3: dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
                   image_size=224, patch_size=32, layer_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh"),
}
_ACTIVATIONS = {
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
}


@dataclass(frozen=True, slots=True)
class VisionConfig:
    kind: str  # CLIP (class token, pre-norm, bias-free patch conv), SIGLIP, or IDEFICS3 (SigLIP, any tile size)
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    image_size: int
    patch_size: int
    num_channels: int = 3
    layer_norm_eps: float = 1e-5
    hidden_act: str = "quick_gelu"

    @classmethod
    def from_hf(cls, d: dict[str, Any]) -> "VisionConfig":
        kind = d.get("model_type", CLIP)
        if kind not in _DEFAULTS:
            raise ValueError(f"vision_config.model_type {kind!r} is not supported ({sorted(_DEFAULTS)} are)")
        d = _DEFAULTS[kind] | d
        if d["hidden_act"] not in _ACTIVATIONS:
            raise ValueError(f"vision_config.hidden_act {d['hidden_act']!r} is not supported "
                             f"({sorted(_ACTIVATIONS)} are)")
        return cls(kind, d["hidden_size"], d["intermediate_size"], d["num_hidden_layers"], d["num_attention_heads"],
                   d["image_size"], d["patch_size"], d.get("num_channels", 3), d["layer_norm_eps"], d["hidden_act"])

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def has_class_token(self) -> bool:
        return self.kind == CLIP


class _Attention(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        d = cfg.hidden_size
        self.num_heads = cfg.num_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (p(x).view(b, t, self.num_heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        o = F.scaled_dot_product_attention(q, k, v)  # bidirectional: every patch sees every patch
        return self.out_proj(o.transpose(1, 2).reshape(b, t, d))


class _MLP(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.act = _ACTIVATIONS[cfg.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class _EncoderLayer(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.self_attn = _Attention(cfg)
        self.layer_norm2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.mlp = _MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class _Embeddings(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        # the strided convolution is the patchify: one embedding per patch_size x patch_size patch
        self.patch_embedding = nn.Conv2d(cfg.num_channels, cfg.hidden_size, cfg.patch_size, cfg.patch_size,
                                         bias=not cfg.has_class_token)
        self.class_embedding = nn.Parameter(torch.zeros(cfg.hidden_size)) if cfg.has_class_token else None
        self.position_embedding = nn.Embedding(cfg.num_patches + int(cfg.has_class_token), cfg.hidden_size)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.patch_embedding(pixels.to(self.patch_embedding.weight.dtype)).flatten(2).transpose(1, 2)
        if self.class_embedding is not None:
            x = torch.cat([self.class_embedding.expand(x.shape[0], 1, -1), x], dim=1)
        if x.shape[1] == self.position_embedding.num_embeddings:
            return x + self.position_embedding.weight
        return x + self.position_embedding(self._bucketed_positions(*pixels.shape[-2:]))

    def _bucketed_positions(self, height: int, width: int) -> torch.Tensor:
        """Idefics3's positions for a tile of another size: each patch takes the position its fractional
        coordinates fall in on the trained grid (computed in the same float steps as transformers)."""
        side = int(self.position_embedding.num_embeddings ** 0.5)
        patch = self.patch_embedding.kernel_size[0]
        device = self.position_embedding.weight.device
        boundaries = torch.arange(1 / side, 1.0, 1 / side, device=device)

        def buckets(n: int) -> torch.Tensor:
            coords = torch.arange(n, device=device, dtype=torch.float32) * (1.0 / torch.tensor(float(n)))
            return torch.bucketize(coords.clamp(max=1.0 - 1e-6), boundaries, right=True)

        return (buckets(height // patch)[:, None] * side + buckets(width // patch)[None, :]).reshape(-1)


class _Encoder(nn.Module):
    """HF's `encoder` level of the tower (its weights are named `encoder.layers.*`)."""

    def __init__(self, layers: nn.ModuleList):
        super().__init__()
        self.layers = layers


class VisionTower(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.config = cfg
        self.embeddings = _Embeddings(cfg)
        self.pre_layrnorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps) if cfg.kind == CLIP else None
        self.encoder = _Encoder(nn.ModuleList(_EncoderLayer(cfg) for _ in range(cfg.num_layers)))
        self.post_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)  # of the last hidden state

    def hidden_states(self, pixels: torch.Tensor, upto: int) -> list[torch.Tensor]:
        """The input to the encoder, then each layer's output, up to and including hidden state `upto`
        (layers after the deepest selected one are skipped)."""
        size, patch = self.config.image_size, self.config.patch_size
        tiles_any_size = self.config.kind == IDEFICS3
        if (tiles_any_size and any(d % patch for d in pixels.shape[-2:])) or \
                (not tiles_any_size and tuple(pixels.shape[-2:]) != (size, size)):
            raise ValueError(f"pixel values are {tuple(pixels.shape[-2:])}, the vision tower takes "
                             f"{'multiples of ' + str(patch) if tiles_any_size else f'{size}x{size}'}")
        x = self.embeddings(pixels)
        if self.pre_layrnorm is not None:
            x = self.pre_layrnorm(x)
        states = [x]
        for layer in self.encoder.layers[:upto]:
            x = layer(x)
            states.append(x)
        return states

    def last_hidden_state(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.post_layernorm(self.hidden_states(pixels, self.config.num_layers)[-1])
