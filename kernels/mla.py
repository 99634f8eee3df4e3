"""Multi-head latent attention (DeepSeek's MLA) over a latent KV pool, in torch: the math both attention
backends share for `forward_latent`.

A cached row is [c_kv (R) | k_rope (r)]. Prefill and extend up-project every key's latent into per-head
K = [W_UK c_kv | k_rope] and V = W_UV c_kv and run ordinary attention (a chunk has many queries, so the
up-projection pays for itself, and the scores round as the checkpoint's own MHA form does). Decode keeps
the latent: W_UK folds into the query and W_UV into the output, so all heads attend over the one latent
row per key (MQA with head size R + r, values the first R dims).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def split_up_proj(w_kv_b: torch.Tensor, nope: int) -> tuple[torch.Tensor, torch.Tensor]:
    """kv_b_proj's weight as [H, nope + v, R] -> (W_UK [H, nope, R], W_UV [H, v, R])."""
    return w_kv_b.split([nope, w_kv_b.shape[1] - nope], dim=1)


def absorb_query(q_nope: torch.Tensor, q_rope: torch.Tensor, w_uk: torch.Tensor) -> torch.Tensor:
    """q_nope [T, H, n], q_rope [T, H, r], W_UK [H, n, R] -> the latent-space query [T, H, R + r]."""
    return torch.cat([torch.einsum("thn,hnr->thr", q_nope, w_uk), q_rope], dim=-1)


def absorb_output(o_latent: torch.Tensor, w_uv: torch.Tensor) -> torch.Tensor:
    """The attention-weighted latents [T, H, R] -> per-head values [T, H, v] through W_UV [H, v, R]."""
    return torch.einsum("thr,hvr->thv", o_latent, w_uv)


def latent_decode(q_abs: torch.Tensor, rows: torch.Tensor, mask: torch.Tensor | None, rank: int,
                  scale: float) -> torch.Tensor:
    """Absorbed attention: q_abs [b, H, R + r] over each sequence's latent rows [b, L, R + r] (mask
    [b, L] bool, True where a key is real; None: no padding) -> [b, H, R]."""
    keys = rows.unsqueeze(1)  # one KV head shared by every query head
    attn_mask = None if mask is None else mask[:, None, None, :]
    o = F.scaled_dot_product_attention(q_abs.unsqueeze(2), keys, keys[..., :rank], attn_mask=attn_mask,
                                       scale=scale, enable_gqa=True)
    return o.squeeze(2)


def latent_extend(q_nope: torch.Tensor, q_rope: torch.Tensor, rows: torch.Tensor, mask: torch.Tensor,
                  w_kv_b: torch.Tensor, scale: float) -> torch.Tensor:
    """Unabsorbed attention of n queries (q_nope [n, H, nope], q_rope [n, H, r]) over a sequence's latent
    rows [L, R + r] with visibility mask [n, L] -> [n, H, v]. K and V come out of one kv_b_proj matmul, as
    the checkpoint's own MHA form computes them."""
    heads, nope, rank = q_nope.shape[1], q_nope.shape[2], w_kv_b.shape[2]
    c_kv, k_rope = rows[:, :rank], rows[:, rank:]
    k_nope, v = F.linear(c_kv, w_kv_b.reshape(-1, rank)).view(-1, heads, w_kv_b.shape[1]).split(
        [nope, w_kv_b.shape[1] - nope], dim=-1)
    k = torch.cat([k_nope, k_rope[:, None, :].expand(-1, heads, -1)], dim=-1).transpose(0, 1)
    q = torch.cat([q_nope, q_rope], dim=-1).transpose(0, 1)
    o = F.scaled_dot_product_attention(q, k, v.transpose(0, 1), attn_mask=mask, scale=scale)
    return o.transpose(0, 1)
