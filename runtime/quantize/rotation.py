"""Rotations of a model that keep its function and spread its weights' outliers before int4 rounding
(QuIP's incoherence processing, Chee et al. 2023; QuaRot, Ashkboos et al. 2024; SpinQuant, Liu et al. 2024).

A group of int4 weights rounds on one grid from its min to its max: a few large weights in a group stretch
the grid and the others keep only a few levels. For an orthogonal Q, W Q reads the same input rotated by Q,
and its rows' mass is spread over every column: no column stands out, and the grid fits them all.

R1, the residual stream: every hidden state x becomes x Q (rows). An RMSNorm commutes with it only without
its weight g (RMSNorm(x Q) = RMSNorm(x) Q, Q keeping the norm), so each norm's g is first folded into the
linears that read it (W diag(g)) and set to 1. Then the embedding E <- E Q, each linear that reads the
residual (q/k/v, gate/up, the LM head) W <- W Q, and each one that writes it (o_proj, down_proj) W <- Q^T W
(its bias too). The LM head, folded with the final norm's g, no longer equals the embedding: a tied model
becomes untied.

R2, per attention head: v's outputs of each head rotated by an orthogonal R of head_dim (W_v <- R^T W_v per
head); attention mixes v's rows linearly, so each head's output comes out rotated by R, and o_proj's input
columns of each head take it back (W_o <- W_o diag(R, .., R)).

Q and R are randomized Hadamard matrices, H diag(+-1) / sqrt(n) (hadamard.py; 576 = 72 x 8), or a seeded
random orthogonal matrix where n has no Hadamard construction. Both are offline: the rotated model is a plain
Llama checkpoint that any loader reads.

`radixlang quantize --rotate` applies them; off by default, because on SmolLM2 they made RTN, GPTQ and AWQ
round worse (docs/models.md): its few huge residual channels, damped by the norms' weights, meet every
rotated weight once those weights are folded in.
"""
from __future__ import annotations

from typing import Iterable, cast

import torch

from ..distributed.layers import ParallelLMHead
from ..models.linear.hadamard import hadamard
from ..models.llama import DecoderLayer, LlamaForCausalLM, RMSNorm

SEED = 0  # the random signs (and the fallback's matrix): one fixed rotation, so a quantize run repeats


def random_orthogonal(n: int, seed: int = SEED) -> torch.Tensor:
    """An orthogonal [n, n] float64 matrix: H diag(+-1) (H the orthonormal Hadamard matrix of size n), or
    where none is built for n, the Q of a seeded Gaussian matrix's QR."""
    gen = torch.Generator().manual_seed(seed)
    try:
        h = hadamard(n)
    except ValueError:
        q, r = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
        return q * r.diagonal().sign()
    signs = torch.randint(0, 2, (n,), generator=gen, dtype=torch.float64) * 2 - 1
    return h * signs


def check_rotatable(model: torch.nn.Module) -> None:
    """Raises ValueError for a model whose structure the rotation does not know (not a Llama-family model
    with plain RMSNorms before every linear that reads the residual stream)."""
    ok = isinstance(model, LlamaForCausalLM) and type(model.norm) is RMSNorm and all(
        isinstance(layer, DecoderLayer) and type(layer.input_layernorm) is RMSNorm
        and type(layer.post_attention_layernorm) is RMSNorm for layer in model.layers)
    if not ok or model.tp.size != 1:
        raise ValueError(f"--rotate rotates Llama-family models (RMSNorm, one process); {type(model).__name__} "
                         "is not one: quantize it with --no-rotate")


@torch.no_grad()
def rotate_model(model: LlamaForCausalLM, heads: bool = True, seed: int = SEED) -> None:
    """R1 (and with `heads` R2) applied to `model` in place; its function (logits) stays the same up to
    rounding. A tied LM head is untied (config.tie_word_embeddings becomes False)."""
    check_rotatable(model)
    cfg = model.config
    q = random_orthogonal(cfg.hidden_size, seed)
    head_r = random_orthogonal(cfg.head_dim, seed + 1) if heads else None
    embed = model.embed_tokens.weight
    head_weight = (embed if model.lm_head is None else model.lm_head.weight).detach().double()
    if model.lm_head is None:
        model.lm_head = ParallelLMHead(cfg.hidden_size, cfg.vocab_size, model.tp).to(embed.device, embed.dtype)
        cfg.tie_word_embeddings = False
    _set(model.lm_head.weight, head_weight * _fold(model.norm) @ q)
    _set(embed, embed.double() @ q)
    for layer in cast("Iterable[DecoderLayer]", model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        for norm, reads in ((layer.input_layernorm, attn.qkv_proj), (layer.post_attention_layernorm, mlp.gate_up_proj)):
            _set(reads.weight, reads.weight.double() * _fold(norm) @ q)
        for writes in (attn.o_proj, mlp.down_proj):
            _set(writes.weight, q.T @ writes.weight.double())
            if writes.bias is not None:
                _set(writes.bias, q.T @ writes.bias.double())
        if head_r is not None:
            _rotate_heads(layer, head_r)


def _rotate_heads(layer: DecoderLayer, r: torch.Tensor) -> None:
    """R2: v's rows of each KV head become R^T W_v (its bias R^T b), o_proj's columns of each head W_o R."""
    attn = layer.self_attn
    d = attn.head_dim
    v_rows = slice(attn.q_size + attn.kv_size, attn.q_size + 2 * attn.kv_size)
    qkv, o = attn.qkv_proj, attn.o_proj
    v = qkv.weight[v_rows].double().view(attn.num_kv_heads, d, -1)
    _set(qkv.weight[v_rows], (r.T @ v).reshape(attn.kv_size, -1))
    if qkv.bias is not None:
        _set(qkv.bias[v_rows], (r.T @ qkv.bias[v_rows].double().view(attn.num_kv_heads, d, 1)).reshape(-1))
    w_o = o.weight.double().view(o.weight.shape[0], attn.num_heads, d)
    _set(o.weight, (w_o @ r).reshape(o.weight.shape))


def _fold(norm: RMSNorm) -> torch.Tensor:
    """The norm's weights, to fold into the linears that read it; the norm's become 1."""
    g = norm.weight.double().clone()  # a copy whatever the model's dtype: the norm's are overwritten
    norm.weight.fill_(1)
    return g


def _set(param: torch.Tensor, value: torch.Tensor) -> None:
    param.copy_(value.to(param.dtype))
