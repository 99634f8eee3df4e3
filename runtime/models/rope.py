"""RoPE parameters from either config format, and the cos/sin tables transformers would compute.

transformers < 5 writes `rope_theta` and `rope_scaling` at the top level of config.json; transformers 5
writes one `rope_parameters` dict holding `rope_theta` and `rope_type`. Both read the same here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")
DEFAULT_THETA = 10000.0
_REQUIRED = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
}


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """One model's RoPE: base, scaling type and that type's parameters, all resolved."""

    rope_type: str = "default"
    theta: float = DEFAULT_THETA
    factor: float = 1.0
    original_max_position: int = 0  # llama3 / yarn: the pretraining context length
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    truncate: bool = True  # yarn: round the correction range to whole dimensions
    attention_factor: float = 1.0  # yarn: scales cos and sin
    freq_divisors: tuple[float, ...] | None = None  # GGUF `rope_freqs`: llama3 scaling baked per dimension


def rope_from_hf(hf: dict[str, Any]) -> RopeScaling:
    """Reads `rope_parameters` (new) or `rope_theta` + `rope_scaling` (old) the way transformers does."""
    params = dict(_flat_rope_dict(hf))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"rope_type {rope_type!r} is not supported; supported types: {', '.join(ROPE_TYPES)}")
    partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise ValueError(f"partial_rotary_factor must be 1.0 for this model family, got {partial!r}")
    missing = [k for k in _REQUIRED[rope_type] if k not in params]
    if missing:
        raise ValueError(f"rope_type {rope_type!r} needs {missing} in rope_parameters / rope_scaling")
    theta = float(params.get("rope_theta") or hf.get("rope_theta") or DEFAULT_THETA)
    max_position = int(hf.get("max_position_embeddings", 0))
    # transformers prefers a top-level original_max_position_embeddings (Phi-3 style), then the dict's
    original = int(hf.get("original_max_position_embeddings") or params.get("original_max_position_embeddings")
                   or max_position)
    if rope_type in ("yarn", "llama3") and original <= 0:
        raise ValueError(f"rope_type {rope_type!r} needs original_max_position_embeddings > 0")
    if rope_type == "default":
        return RopeScaling(theta=theta)
    if rope_type in ("linear", "dynamic"):
        return RopeScaling(rope_type, theta, _positive("factor", params["factor"]))
    if rope_type == "llama3":
        return RopeScaling(rope_type, theta, _positive("factor", params["factor"]), original,
                           float(params["low_freq_factor"]), float(params["high_freq_factor"]))
    return _yarn(params, theta, max_position, original)


def _flat_rope_dict(hf: dict[str, Any]) -> dict[str, Any]:
    """transformers lets `rope_scaling` override `rope_parameters`; a per-layer-type dict must agree."""
    params = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise ValueError(f"rope_parameters must be a dict, got {type(params).__name__}")
    layer_types = set(hf.get("layer_types") or ())
    nested = [v for k, v in params.items() if k in layer_types]
    if not nested:
        return params
    if any(v != nested[0] for v in nested):
        raise ValueError("rope_parameters differ between layer types; this model family uses one RoPE")
    return nested[0] or {}


def _positive(name: str, value: object) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"rope {name} must be a number > 0, got {value!r}")
    return float(value)


def _yarn(params: dict[str, Any], theta: float, max_position: int, original: int) -> RopeScaling:
    factor = params["factor"]
    if factor is None:  # transformers: the ratio of the extended to the pretraining context
        factor = max_position / original
    factor = _positive("factor", factor)
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)
    return RopeScaling("yarn", theta, factor, original, beta_fast=float(params.get("beta_fast") or 32),
                       beta_slow=float(params.get("beta_slow") or 1), truncate=bool(params.get("truncate", True)),
                       attention_factor=float(attention_factor))


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_inv_freq(rope: RopeScaling, head_dim: int) -> torch.Tensor:
    """Inverse frequencies [head_dim / 2] in fp32, op for op as transformers builds them."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (rope.theta**exponents)
    # dynamic NTK only changes the base past max_position_embeddings, which the engine never reaches
    if rope.rope_type == "linear":
        inv_freq = inv_freq / rope.factor
    elif rope.rope_type == "llama3":
        inv_freq = _llama3(inv_freq, rope)
    elif rope.rope_type == "yarn":
        inv_freq = _yarn_inv_freq(rope, head_dim)
    if rope.freq_divisors is not None:
        inv_freq = inv_freq / torch.tensor(rope.freq_divisors, dtype=torch.float32)
    return inv_freq


def _llama3(inv_freq: torch.Tensor, rope: RopeScaling) -> torch.Tensor:
    """Long wavelengths are divided by `factor`, short ones kept, the band between interpolated."""
    context, low, high = rope.original_max_position, rope.low_freq_factor, rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > context / low, inv_freq / rope.factor, inv_freq)
    smooth = (context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = ~(wavelen < context / high) * ~(wavelen > context / low)
    return torch.where(medium, smoothed, scaled)


def _yarn_inv_freq(rope: RopeScaling, head_dim: int) -> torch.Tensor:
    """Interpolated (divided by `factor`) below a ramp of dimensions, extrapolated (kept) above it."""
    pos_freqs = rope.theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    extrapolated, interpolated = 1.0 / pos_freqs, 1.0 / (rope.factor * pos_freqs)
    low = _yarn_correction_dim(rope.beta_fast, head_dim, rope.theta, rope.original_max_position)
    high = _yarn_correction_dim(rope.beta_slow, head_dim, rope.theta, rope.original_max_position)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # keeps the ramp finite
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp
    return interpolated * (1 - keep) + extrapolated * keep


def _yarn_correction_dim(rotations: float, dim: int, base: float, context: int) -> float:
    """The dimension whose wavelength fits `rotations` times in the pretraining context."""
    return (dim * math.log(context / (rotations * 2 * math.pi))) / (2 * math.log(base))


def rope_cos_sin(rope: RopeScaling, head_dim: int, num_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables [num_positions, head_dim / 2] in fp32, yarn's attention factor applied."""
    angles = torch.outer(torch.arange(num_positions, dtype=torch.float32), rope_inv_freq(rope, head_dim))
    return angles.cos() * rope.attention_factor, angles.sin() * rope.attention_factor
