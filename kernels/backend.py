"""The attention-backend contract: what the model hands a kernel for one forward pass.

The runtime owns the KV memory and passes its buffers in; kernels never import the runtime.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(slots=True)
class AttentionMetadata:
    """One batch of sequences; sequence i appends `extend_lens[i]` tokens to a KV of `seq_lens[i]`.

    `seq_lens` counts the new tokens too, so the cached prefix is `seq_lens[i] - extend_lens[i]`.
    The query/key/value rows of the batch are the sequences' new tokens, concatenated in order.
    """

    req_to_token: torch.Tensor  # [max_reqs, max_context] int32: position -> KV slot
    req_pool_indices: torch.Tensor  # [batch] int64: each sequence's row in req_to_token
    seq_lens: list[int]
    extend_lens: list[int]
    out_cache_loc: torch.Tensor  # [num_tokens] int64: the slot each new token's K/V is written to

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)


class AttentionBackend(Protocol):
    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,
        k_cache: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        """Write k/v into the cache at `meta.out_cache_loc`, then attend causally over each KV."""
        ...
