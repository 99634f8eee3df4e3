"""The models a draft-model drafter runs: a second model file that shares the target's tokenizer
(STANDALONE), or the target's own first k layers with its final norm and head (SELF)."""
from __future__ import annotations

import torch
from torch import nn

from ..model_loading import load_model
from ..models.llama import ForwardContext, LlamaForCausalLM
from ..models.loading.loader import LoadedModel


class EarlyExit(nn.Module):
    """The target's first `num_layers` layers, then its final norm and head: a draft model that costs no
    weights of its own (self-speculative decoding)."""

    def __init__(self, target: LlamaForCausalLM, num_layers: int):
        super().__init__()
        layers = target.config.num_layers
        if not 1 <= num_layers < layers:
            raise ValueError(f"speculative_draft_layers must be in [1, {layers - 1}] for this {layers}-layer "
                             f"model, got {num_layers}")
        self.target, self.num_layers = target, num_layers

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        t = self.target
        x, rope = t.embed_tokens(input_ids), t.rotary.table(positions)
        for layer in t.layers[: self.num_layers]:  # layer ids 0..k-1: the draft pool's own k layers
            x = layer(x, rope, ctx)
        return t.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.target.compute_logits(hidden)


DraftLM = LlamaForCausalLM | EarlyExit


def weights_per_token(model: DraftLM) -> int:
    """Parameters a token's forward multiplies by (its layers and the head; the embedding is a lookup): on
    a memory-bound device, what a forward of a few tokens costs."""
    base = model.target if isinstance(model, EarlyExit) else model
    layers = base.layers[: model.num_layers] if isinstance(model, EarlyExit) else base.layers
    head = getattr(base.lm_head, "weight", base.embed_tokens.weight)  # tied, or packed (the embedding's shape)
    return head.numel() + sum(p.numel() for layer in layers for p in layer.parameters())


def load_standalone(path: str, target: LoadedModel, context_length: int, device: torch.device,
                    dtype: torch.dtype) -> LlamaForCausalLM:
    """The draft model file at `path`, refused unless it shares the target's tokenizer and vocabulary
    (draft token ids are verified as target token ids) and holds the target's context."""
    draft = load_model(path, device, dtype)
    vocab, draft_vocab = target.model.config.vocab_size, draft.model.config.vocab_size
    if draft_vocab != vocab:
        raise ValueError(f"speculative_draft_model {path!r} has a vocabulary of {draft_vocab} tokens; the "
                         f"target's has {vocab}: a draft model must share the target's tokenizer")
    if draft.tokenizer.hf.get_vocab(with_added_tokens=True) != target.tokenizer.hf.get_vocab(with_added_tokens=True):
        raise ValueError(f"speculative_draft_model {path!r} has a different tokenizer (token strings or ids "
                         "differ from the target's): a draft model must share the target's tokenizer")
    if draft.model.config.max_position < context_length:
        raise ValueError(f"speculative_draft_model {path!r} holds {draft.model.config.max_position} positions; "
                         f"the context is {context_length}")
    return draft.model
