"""The Llama family in torch: GQA, RoPE, RMSNorm, SwiGLU; Qwen2 (QKV bias) and Qwen3 (QK norm) too."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Protocol, cast

import torch
import torch.nn.functional as F
from torch import nn

from ...kernels.cpu import dense_linear
from ..distributed.group import TensorParallel
from ..distributed.layers import (
    ColumnParallelLinear,
    FixedOrderLinear,
    ParallelLMHead,
    Part,
    RowParallelLinear,
    VocabParallelEmbedding,
    check_tp_size,
    load_shard,
)
from .rope import RopeScaling, rope_cos_sin


@dataclass(slots=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position: int  # the longest context computed exactly as the reference does (see sliding_window)
    rms_norm_eps: float = 1e-5
    rope: RopeScaling = field(default_factory=RopeScaling)
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2 always; Llama / Qwen3 with attention_bias
    o_bias: bool = False  # Llama / Qwen3 with attention_bias
    mlp_bias: bool = False  # Llama's mlp_bias
    qk_norm: bool = False  # Qwen3: RMSNorm over each head of q and k before RoPE
    # Sliding-window attention equals full attention while the context fits the window, so max_position
    # is capped to it rather than masking keys that fall out of the window
    sliding_window: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class LayerAttention(Protocol):
    """What the layers call of the attention: a kernels AttentionBackend planned for the step (which says
    the shapes), or quantize's whole-sequence attention of a calibration pass."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, scale: float, /
                ) -> torch.Tensor: ...

    def forward_latent(self, q_nope: torch.Tensor, q_rope: torch.Tensor, latent: torch.Tensor, layer: int,
                       scale: float, w_kv_b: torch.Tensor, /) -> torch.Tensor: ...


class LoraDelta(Protocol):
    """The step's LoRA adapters (runtime/lora/pool.py's LoraBatch): adds each row's low-rank delta to the output
    `y` of a fused linear ("qkv", "o", "gate_up", "down") of layer `layer`, whose input was `x`; `embed` adds the
    token embedding's delta of each token `input_ids` (the step's) to their embeddings `x`, and `logits` the LM
    head's to the logits of `hidden` (the step's tokens `rows`)."""

    def add(self, layer: int, group: str, x: torch.Tensor, y: torch.Tensor, /) -> torch.Tensor: ...

    def embed(self, input_ids: torch.Tensor, x: torch.Tensor, /) -> torch.Tensor: ...

    def logits(self, rows: list[int], hidden: torch.Tensor, logits: torch.Tensor, /) -> torch.Tensor: ...


@dataclass(slots=True)
class ForwardContext:
    """What one forward pass needs besides token ids and positions: the attention backend, already
    planned for this step (it holds the step's KV index tensors and the per-layer KV buffers), and the
    step's LoRA adapters (None: every row runs the base model)."""

    attn: LayerAttention
    lora: LoraDelta | None = None


class RMSNorm(nn.Module):
    # radixlang_cpu::rms_norm / add_rms_norm (kernels/cpu/dense_mm.cpp): one summation order, in the eager forward
    # and, as an opaque op, in the compiled one (inductor fused torch's norm into the residual add before it and
    # summed in its own order: the compiled decode's logprobs differed from eager's). Set once, at load (use_fixed_order).
    fixed_order = False

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def add(self, x: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + delta, its norm): a residual add and the norm after it, in one pass of the native op."""
        if self.fixed_order and x.dtype == torch.float32:
            return torch.ops.radixlang_cpu.add_rms_norm(x, delta, self.weight, self.eps)
        x = x + delta
        return x, self(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fixed_order and x.dtype == torch.float32:
            return torch.ops.radixlang_cpu.rms_norm(x, self.weight, self.eps)
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:  # the same math in one call
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


RopeTable = tuple[torch.Tensor, torch.Tensor]  # (cos, sin) [T, 1, d/2] each: one step's positions


class Rotary(nn.Module):
    """Non-interleaved (rotate-half) RoPE, as HF Llama applies it after llama.cpp's permute is undone."""

    cos_sin: torch.Tensor  # a buffer (register_buffer), which nn.Module's typing cannot see

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        cos, sin = rope_cos_sin(cfg.rope, cfg.head_dim, cfg.max_position)
        self.register_buffer("cos_sin", torch.cat([cos, sin], dim=-1), persistent=False)  # one lookup per step

    def table(self, positions: torch.Tensor) -> RopeTable:
        """Looked up once per forward and shared by every layer."""
        cos, sin = self.cos_sin.index_select(0, positions).unsqueeze(1).chunk(2, dim=-1)
        return cos, sin


def apply_rope(x: torch.Tensor, rope: RopeTable) -> torch.Tensor:
    """x: [T, heads, d] (any heads: q and k rotate in one call)."""
    cos, sin = rope
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class Attention(nn.Module):
    """Under tensor parallelism this rank's share of the heads (KV heads replicated when fewer than ranks)."""

    def __init__(self, cfg: LlamaConfig, layer_id: int, tp: TensorParallel):
        super().__init__()
        self.layer_id = layer_id
        heads, kv_heads = Part(cfg.num_heads, cfg.head_dim), Part(cfg.num_kv_heads, cfg.head_dim)
        self.num_heads, self.num_kv_heads = heads.local_units(tp.size), kv_heads.local_units(tp.size)
        self.head_dim = cfg.head_dim
        self.q_size = self.num_heads * cfg.head_dim
        self.kv_size = self.num_kv_heads * cfg.head_dim
        self.qkv_proj = ColumnParallelLinear(cfg.hidden_size, [heads, kv_heads, kv_heads], cfg.qkv_bias, tp)
        self.o_proj = RowParallelLinear(heads, cfg.hidden_size, cfg.o_bias, tp)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.scale = cfg.head_dim**-0.5

    def forward(self, x: torch.Tensor, rope: RopeTable, ctx: ForwardContext):
        qkv = self.qkv_proj(x)
        if ctx.lora is not None:
            qkv = ctx.lora.add(self.layer_id, "qkv", x, qkv)
        qk, v = qkv.split([self.q_size + self.kv_size, self.kv_size], dim=-1)
        qk = qk.view(-1, self.num_heads + self.num_kv_heads, self.head_dim)  # q heads, then k heads
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:  # both or neither (cfg.qk_norm)
            qk = torch.cat([self.q_norm(qk[:, :self.num_heads]), self.k_norm(qk[:, self.num_heads:])], dim=1)
        q, k = apply_rope(qk, rope).split([self.num_heads, self.num_kv_heads], dim=1)
        o = ctx.attn.forward(q, k, v, self.layer_id, self.scale).flatten(1)  # [T, heads * head_dim]
        out = self.o_proj(o)  # T = 0 included (an idle DP-attention rank)
        return out if ctx.lora is None else ctx.lora.add(self.layer_id, "o", o, out)


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig, tp: TensorParallel, layer_id: int = 0):
        super().__init__()
        channels = Part(cfg.intermediate_size)
        self.layer_id = layer_id
        self.gate_up_proj = ColumnParallelLinear(cfg.hidden_size, [channels, channels], cfg.mlp_bias, tp)
        self.down_proj = RowParallelLinear(channels, cfg.hidden_size, cfg.mlp_bias, tp)

    def forward(self, x: torch.Tensor, lora: LoraDelta | None = None) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if lora is not None:
            gate_up = lora.add(self.layer_id, "gate_up", x, gate_up)
        gate, up = gate_up.chunk(2, dim=-1)
        h = F.silu(gate) * up
        out = self.down_proj(h)
        return out if lora is None else lora.add(self.layer_id, "down", h, out)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig, layer_id: int, tp: TensorParallel):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer_id, tp)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg, tp, layer_id)

    def forward(self, x: torch.Tensor, rope: RopeTable, ctx: ForwardContext) -> torch.Tensor:
        x, delta = self.residual_step(x, None, rope, ctx)
        return x + delta

    def residual_step(self, x: torch.Tensor, delta: torch.Tensor | None, rope: RopeTable,
                      ctx: ForwardContext) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer on the residual x + `delta` (the previous layer's MLP output, not yet added): returns the
        residual before this layer's MLP output, and that output. Each residual add then runs with the norm after
        it (RMSNorm.add: one native op per norm)."""
        if delta is None:
            h = self.input_layernorm(x)
        else:
            x, h = self.input_layernorm.add(x, delta)
        x, h = self.post_attention_layernorm.add(x, self.self_attn(h, rope, ctx))
        # adapters serve dense Llama-family models only (runtime/lora): a MoE block is never given one
        return x, (self.mlp(h) if ctx.lora is None else self.mlp(h, ctx.lora))


class LlamaForCausalLM(nn.Module):
    """`tp`: this rank's place in a tensor-parallel group (default: one process, no communication)."""

    fixed_order_head = False  # a tied LM head's fp32 matmul in one order (distributed/layers.py: use_fixed_order)

    def __init__(self, cfg: LlamaConfig, tp: TensorParallel | None = None):
        super().__init__()
        self.config = cfg
        self.tp = tp = tp or TensorParallel()
        check_tp_size(cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size, cfg.hidden_size, tp.size)
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, tp) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rotary(cfg)
        self.lm_head = None if cfg.tie_word_embeddings else ParallelLMHead(cfg.hidden_size, cfg.vocab_size, tp)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext,
                embeds: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Returns the final hidden states [num_tokens, hidden]; `compute_logits` picks rows.
        `embeds` = (rows, values): those tokens take these input embeddings (an image's span)."""
        x = self.embed_tokens(input_ids)
        if ctx.lora is not None:
            x = ctx.lora.embed(input_ids, x)
        if embeds is not None:
            x = x.index_copy(0, embeds[0], embeds[1].to(x.dtype))
        rope = self.rotary.table(positions)
        delta: torch.Tensor | None = None
        for layer in cast("Iterable[DecoderLayer]", self.layers):
            x, delta = layer.residual_step(x, delta, rope, ctx)
        return self.norm(x) if delta is None else self.norm.add(x, delta)[1]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[rows, vocab] float32 logits (under tensor parallelism: on rank 0; other ranks get their shard)."""
        if self.lm_head is None:  # tied to the embedding
            logits = dense_linear.linear(hidden, self.embed_tokens.weight, None, self.fixed_order_head).float()
        else:
            logits = self.lm_head(hidden).float()
        return self.tp.gather_vocab(logits, self.config.vocab_size)

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | None = None) -> None:
        """Takes HF-named tensors; fuses q/k/v and gate/up into this module's packed linears. Every other
        parameter becomes its tensor as given, converted only where its device or `dtype` (default: the
        parameters' own) differs: a tensor mapped from a file stays a view of it, with no copy."""
        params = dict(self.named_parameters())
        packed: dict[str, dict[str, torch.Tensor]] = {}
        loaded: set[str] = set()
        for name, tensor in weights:
            name = name.removeprefix("model.")
            if name == "lm_head.weight" and self.lm_head is None:
                continue
            target, part = packed_target(name)
            if part is not None:
                packed.setdefault(target, {})[part] = tensor
                continue
            if name not in params:
                raise ValueError(f"unexpected weight {name!r} for this model")
            _assign(self, name, params[name], load_shard(self, name, tensor), dtype)
            loaded.add(name)
        for target, parts in packed.items():
            order = packed_parts(target)
            missing = [p for p in order if p not in parts]
            if missing:
                raise ValueError(f"weights for {target} are missing parts {missing}")
            stacked = [parts[p] for p in order]
            if stacked[0].is_meta:  # deferred by the loader: no op on meta tensors (they import torch's compiler)
                fused = torch.empty((sum(len(t) for t in stacked), *stacked[0].shape[1:]), device="meta")
            else:
                fused = torch.cat(stacked)
            _assign(self, target, params[target], load_shard(self, target, fused), dtype)
            loaded.add(target)
        absent = sorted(set(params) - loaded)
        if absent:
            raise ValueError(f"checkpoint is missing weights: {absent[:5]}{'...' if len(absent) > 5 else ''}")


_PACKED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", "q"),
    "self_attn.k_proj": ("self_attn.qkv_proj", "k"),
    "self_attn.v_proj": ("self_attn.qkv_proj", "v"),
    "mlp.gate_proj": ("mlp.gate_up_proj", "gate"),
    "mlp.up_proj": ("mlp.gate_up_proj", "up"),
}


def packed_target(name: str) -> tuple[str, str | None]:
    """The module weight an HF weight loads into, and which row block of it (None: all of it)."""
    for src, (dst, part) in _PACKED.items():
        if f".{src}." in name:
            return name.replace(src, dst), part
    return name, None


def packed_parts(target: str) -> tuple[str, ...]:
    """The row blocks a fused weight stacks, in order."""
    return tuple(part for dst, part in _PACKED.values() if f".{dst}." in target)


def _copy_into(param: torch.Tensor, tensor: torch.Tensor, name: str) -> None:
    if tuple(param.shape) != tuple(tensor.shape):
        raise ValueError(f"weight {name!r} has shape {tuple(tensor.shape)}, expected {tuple(param.shape)}")
    param.copy_(tensor.to(param.dtype))


def _assign(model: nn.Module, name: str, param: torch.Tensor, tensor: torch.Tensor, dtype: torch.dtype | None) -> None:
    """Replaces parameter `name` by `tensor` on its device, in `dtype` (default: its own): `to` and
    `contiguous` return the tensor itself when nothing differs. A meta tensor (a weight the loader
    fills in later) stays on the meta device."""
    if tuple(param.shape) != tuple(tensor.shape):
        raise ValueError(f"weight {name!r} has shape {tuple(tensor.shape)}, expected {tuple(param.shape)}")
    value = tensor.to(tensor.device if tensor.is_meta else param.device, dtype or param.dtype).contiguous()
    owner, _, attr = name.rpartition(".")
    setattr(model.get_submodule(owner), attr, nn.Parameter(value, requires_grad=False))


def use_fixed_order(model: nn.Module, on: bool = True) -> int:
    """Turns on (or off) the fixed-order fp32 matmul (kernels/cpu/dense_linear.py) of every FixedOrderLinear, and
    of a tied LM head, whose weight can run it, and the native fixed-order norm of every fp32 RMSNorm on the CPU;
    returns how many. Called once, as the model loads; off where no engine serves the model (quantize's
    calibration passes: MKL's GEMM is 1.3-1.6x faster on their many rows)."""
    count = 0
    for module in model.modules():
        if isinstance(module, FixedOrderLinear) and dense_linear.available_for(module.weight):
            module.fixed_order = on
            count += 1
        elif isinstance(module, LlamaForCausalLM) and dense_linear.available_for(module.embed_tokens.weight):
            module.fixed_order_head = on
            count += 1
        elif isinstance(module, RMSNorm) and dense_linear.available_for(module.weight):
            module.fixed_order = on
            count += 1
    return count
