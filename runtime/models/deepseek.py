"""DeepSeek-V2 / V3: multi-head latent attention (MLA) and MoE with shared experts.

The KV cache holds one latent row per token, [c_kv (kv_lora_rank) | k_rope (qk_rope_head_dim)], as a
single KV "head" whose K and V buffers are the same tensor (a latent pool, `KVPool(shared_kv=True)`).
The attention backend's `forward_latent` runs prefill and extend with per-head K and V up-projected from
the latents, and decode in the absorbed form: W_UK (the key half of kv_b_proj) folds into each query
head, which attends over the latent rows like MQA, and W_UV (the value half) into the output
(kernels/mla.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed.group import TensorParallel
from ..distributed.layers import (
    ColumnParallelLinear,
    ParallelLMHead,
    Part,
    RowParallelLinear,
    VocabParallelEmbedding,
    load_shard,
)
from .llama import ForwardContext, RMSNorm, RopeTable, _copy_into, apply_rope
from .moe import MoeSpec
from .moe_llama import SharedExpert, SparseMoeBlock, stack_experts
from .rope import RopeScaling, rope_cos_sin


@dataclass(slots=True)
class DeepseekConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int  # the dense layers' MLP
    num_layers: int
    num_heads: int
    q_lora_rank: int | None  # None: one q_proj (V2-Lite)
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    max_position: int
    softmax_scale: float  # qk_head_dim ** -0.5, times YaRN's mscale_all_dim correction squared
    moe: MoeSpec
    rms_norm_eps: float = 1e-6
    rope: RopeScaling = field(default_factory=RopeScaling)
    rope_interleave: bool = True  # the checkpoint's rope dims are pairs (x0, x1), (x2, x3), ...
    tie_word_embeddings: bool = False
    attention_bias: bool = False

    # the KV pool's view of the model: one latent "head" per token, K and V the same buffer
    @property
    def num_kv_heads(self) -> int:
        return 1

    @property
    def head_dim(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def latent_kv(self) -> bool:
        return True

    def mha_bytes_per_token(self, element_size: int) -> int:
        """What the same model caches per token in MHA form (per-head K and V), for comparison."""
        per_layer = self.num_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim)
        return self.num_layers * per_layer * element_size


# DeepSeek's own modelling code (and transformers after it) builds q_a_layernorm and kv_a_layernorm with the
# norm's default eps, whatever the config's rms_norm_eps: the released checkpoints set 1e-6 both places
LATENT_NORM_EPS = 1e-6


class MLAttention(nn.Module):
    """Under tensor parallelism this rank's share of the query heads (their q, kv_b and o_proj rows); the
    latent projections and the cached latent row are the same on every rank."""

    def __init__(self, cfg: DeepseekConfig, layer_id: int, tp: TensorParallel):
        super().__init__()
        self.layer_id, self.cfg = layer_id, cfg
        self.heads = cfg.num_heads // tp.size
        qk_dim = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
        if cfg.q_lora_rank is None:
            self.q_proj = ColumnParallelLinear(cfg.hidden_size, [Part(cfg.num_heads, qk_dim)], False, tp)
        else:
            self.q_a_proj = nn.Linear(cfg.hidden_size, cfg.q_lora_rank, bias=cfg.attention_bias)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = ColumnParallelLinear(cfg.q_lora_rank, [Part(cfg.num_heads, qk_dim)], False, tp)
        self.kv_a_proj_with_mqa = nn.Linear(cfg.hidden_size, cfg.kv_lora_rank + cfg.qk_rope_head_dim,
                                            bias=cfg.attention_bias)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, LATENT_NORM_EPS)
        self.kv_b_proj = ColumnParallelLinear(
            cfg.kv_lora_rank, [Part(cfg.num_heads, cfg.qk_nope_head_dim + cfg.v_head_dim)], False, tp)
        self.o_proj = RowParallelLinear(Part(cfg.num_heads, cfg.v_head_dim), cfg.hidden_size, cfg.attention_bias,
                                        tp)

    def project(self, x: torch.Tensor, rope: RopeTable):
        """-> q_nope [T, H, nope], q_rope [T, H, r], latent c_kv [T, R], k_rope [T, 1, r] (rope applied)."""
        cfg = self.cfg
        if cfg.q_lora_rank is None:
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q_nope, q_rope = q.view(-1, self.heads, q.shape[-1] // self.heads).split(
            [cfg.qk_nope_head_dim, cfg.qk_rope_head_dim], dim=-1)
        c_kv, k_rope = self.kv_a_proj_with_mqa(x).split([cfg.kv_lora_rank, cfg.qk_rope_head_dim], dim=-1)
        return q_nope, apply_rope(q_rope, rope), self.kv_a_layernorm(c_kv), apply_rope(k_rope.unsqueeze(1), rope)

    def kv_b_weight(self) -> torch.Tensor:
        """kv_b_proj's weight per head, [H, nope + v, R]: W_UK's rows, then W_UV's."""
        cfg = self.cfg
        return self.kv_b_proj.weight.view(self.heads, cfg.qk_nope_head_dim + cfg.v_head_dim, cfg.kv_lora_rank)

    def forward(self, x: torch.Tensor, rope: RopeTable, ctx: ForwardContext) -> torch.Tensor:
        q_nope, q_rope, c_kv, k_rope = self.project(x, rope)
        latent = torch.cat([c_kv.unsqueeze(1), k_rope], dim=-1)  # [T, 1, R + r]: the cached row
        o = ctx.attn.forward_latent(q_nope, q_rope, latent, self.layer_id, self.cfg.softmax_scale, self.kv_b_weight())
        return self.o_proj(o.flatten(1))  # T = 0 included (an idle DP-attention rank)


class DeepseekDecoderLayer(nn.Module):
    """Over several ranks: attention tensor-parallel, routed experts as `ranks` says (moe_llama); dense and
    shared-expert MLPs whole on every rank."""

    def __init__(self, cfg: DeepseekConfig, layer_id: int, tp: TensorParallel, ranks: dict):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = MLAttention(cfg, layer_id, tp)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if layer_id in cfg.moe.sparse_layers:
            self.mlp: SparseMoeBlock | SharedExpert = SparseMoeBlock(cfg.moe, cfg.hidden_size,
                                                                     shared_name="shared_experts", **ranks)
        else:
            self.mlp = SharedExpert(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x: torch.Tensor, rope: RopeTable, ctx: ForwardContext) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, ctx)
        return x + self.mlp(self.post_attention_layernorm(x))


class MLARotary(nn.Module):
    """RoPE over the qk_rope_head_dim dims only."""

    cos_sin: torch.Tensor  # a buffer, registered in __init__

    def __init__(self, cfg: DeepseekConfig):
        super().__init__()
        cos, sin = rope_cos_sin(cfg.rope, cfg.qk_rope_head_dim, cfg.max_position)
        self.register_buffer("cos_sin", torch.cat([cos, sin], dim=-1), persistent=False)

    def table(self, positions: torch.Tensor) -> RopeTable:
        cos, sin = self.cos_sin.index_select(0, positions).unsqueeze(1).chunk(2, dim=-1)
        return cos, sin


class DeepseekForCausalLM(nn.Module):
    """`dp_attention`: every rank holds the whole MLA, dense MLPs, embedding and head (each runs its own
    requests over its own latent pool); only the routed experts are partitioned over the `tp` ranks."""

    capturable = False  # expert grouping reads routing counts on the host: decode buckets run uncaptured

    def __init__(self, cfg: DeepseekConfig, tp: TensorParallel | None = None, expert_parallel: bool = True,
                 dp_attention: bool = False):
        super().__init__()
        group = tp or TensorParallel()
        self.tp = tp = TensorParallel() if dp_attention else group
        if cfg.num_heads % tp.size:
            raise ValueError(f"tp_size {tp.size} does not split this model's {cfg.num_heads} query heads")
        self.config = cfg
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp)
        ranks = {"ep": group, "local_tokens": dp_attention} if expert_parallel else {"sliced": group}
        self.layers = nn.ModuleList(DeepseekDecoderLayer(cfg, i, tp, ranks) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = MLARotary(cfg)
        self.lm_head = None if cfg.tie_word_embeddings else ParallelLMHead(cfg.hidden_size, cfg.vocab_size, tp)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext,
                embeds: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        rope = self.rotary.table(positions)
        for layer in self.layers:
            x = layer(x, rope, ctx)
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return self.tp.gather_vocab(F.linear(hidden, weight).float(), self.config.vocab_size)

    def moe_blocks(self) -> list[SparseMoeBlock]:
        return [m for m in self.modules() if isinstance(m, SparseMoeBlock)]

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in stack_experts(weights, self.config.moe.num_experts):
            name = name.removeprefix("model.")
            if name == "lm_head.weight" and self.lm_head is None:
                continue
            if name not in params:
                if ".layers." in f".{name}" and int(name.split(".")[1]) >= self.config.num_layers:
                    continue  # V3's multi-token-prediction layers: not used for decoding
                raise ValueError(f"unexpected weight {name!r} for this model")
            if self.config.rope_interleave:
                tensor = self._deinterleave(name, tensor)
            _copy_into(params[name], load_shard(self, name, tensor), name)  # this rank's heads / experts
            loaded.add(name)
        absent = sorted(set(params) - loaded)
        if absent:
            raise ValueError(f"checkpoint is missing weights: {absent[:5]}{'...' if len(absent) > 5 else ''}")

    def _deinterleave(self, name: str, w: torch.Tensor) -> torch.Tensor:
        """Rows of the rope dims reordered (x0, x2, ..., x1, x3, ...): rotate-half RoPE on them then equals
        the checkpoint's interleaved-pair RoPE, and q.k is unchanged as q and k reorder alike."""
        cfg = self.config
        r = cfg.qk_rope_head_dim
        order = torch.cat([torch.arange(0, r, 2), torch.arange(1, r, 2)])
        if name.endswith(("q_proj.weight", "q_b_proj.weight")):
            w = w.view(cfg.num_heads, cfg.qk_nope_head_dim + r, -1).clone()
            w[:, cfg.qk_nope_head_dim:] = w[:, cfg.qk_nope_head_dim + order]
            return w.view(-1, w.shape[-1])
        if name.endswith(("kv_a_proj_with_mqa.weight", "kv_a_proj_with_mqa.bias")):
            w = w.clone()
            w[cfg.kv_lora_rank:] = w[cfg.kv_lora_rank + order]
        return w
