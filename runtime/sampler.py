"""Turns a batch of next-token logits into tokens: penalties, masks, temperature, top-k/p, min-p, seeds.

Log-probabilities are reported from the raw model distribution (before any processing), like vLLM.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling_params import SamplingParams


@dataclass(slots=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # the top-k alternatives as (token_id, logprob), best first


@dataclass(slots=True)
class SamplingState:
    """Per-request sampler state that survives across steps."""

    params: SamplingParams
    generator: torch.Generator
    stop_ids: frozenset[int]  # tokens that end generation (EOS unless ignore_eos, plus stop_token_ids)
    token_counts: torch.Tensor | None = None  # [vocab] output-token counts (frequency/presence)
    seen: torch.Tensor | None = None  # [vocab] bool: in prompt or output (repetition penalty)

    @classmethod
    def create(cls, params: SamplingParams, prompt_ids: list[int], eos_ids: tuple[int, ...],
               vocab_size: int, device: torch.device, seed: int) -> "SamplingState":
        generator = torch.Generator(device=device)
        generator.manual_seed(seed)
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids.update(eos_ids)
        state = cls(params, generator, frozenset(stop_ids))
        if params.frequency_penalty or params.presence_penalty:
            state.token_counts = torch.zeros(vocab_size, device=device)
        if params.repetition_penalty != 1.0:
            state.seen = torch.zeros(vocab_size, dtype=torch.bool, device=device)
            state.seen[torch.tensor(prompt_ids, device=device)] = True
        return state

    def observe(self, token_id: int) -> None:
        if self.token_counts is not None:
            self.token_counts[token_id] += 1
        if self.seen is not None:
            self.seen[token_id] = True


def apply_penalties(logits: torch.Tensor, state: SamplingState) -> torch.Tensor:
    p = state.params
    if state.token_counts is not None:
        logits = logits - p.frequency_penalty * state.token_counts
        logits = logits - p.presence_penalty * (state.token_counts > 0).float()
    if state.seen is not None:
        penalized = torch.where(logits > 0, logits / p.repetition_penalty, logits * p.repetition_penalty)
        logits = torch.where(state.seen, penalized, logits)
    return logits


def filter_probs(probs: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """top-k, then top-p, then min-p, on one request's probabilities; renormalized."""
    if p.top_k > 0 and p.top_k < probs.numel():
        kth = torch.topk(probs, p.top_k).values[-1]
        probs = torch.where(probs < kth, torch.zeros_like(probs), probs)
    if p.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cum = torch.cumsum(sorted_probs, 0)
        drop = (cum - sorted_probs) >= p.top_p * cum[-1]  # keep the smallest head reaching top_p
        sorted_probs = torch.where(drop, torch.zeros_like(sorted_probs), sorted_probs)
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    if p.min_p > 0.0:
        probs = torch.where(probs < p.min_p * probs.max(), torch.zeros_like(probs), probs)
    return probs / probs.sum()


def sample_one(logits: torch.Tensor, state: SamplingState, mask: torch.Tensor | None,
               block_stop: bool) -> int:
    """One request's next token from its [vocab] logits. `mask` is True where a token is allowed."""
    logits = apply_penalties(logits, state)
    if block_stop and state.stop_ids:
        logits = logits.clone()
        logits[list(state.stop_ids)] = -torch.inf
    if mask is not None:
        logits = logits.masked_fill(~mask, -torch.inf)
    p = state.params
    if p.greedy:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / p.temperature, dim=-1)
    probs = filter_probs(probs, p)
    return int(torch.multinomial(probs, 1, generator=state.generator))


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, top_k: int) -> list[TokenLogprob]:
    """Raw log-probabilities of `token_ids` under each row of `logits`, with the top-k per row."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs.gather(1, token_ids.view(-1, 1)).squeeze(1).tolist()
    tops: list[list[tuple[int, float]]] = [[] for _ in chosen]
    if top_k > 0:
        values, indices = torch.topk(logprobs, top_k, dim=-1)
        tops = [list(zip(i, v)) for i, v in zip(indices.tolist(), values.tolist())]
    return [TokenLogprob(t, lp, top) for t, lp, top in zip(token_ids.tolist(), chosen, tops)]
