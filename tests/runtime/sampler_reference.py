"""The per-request sampler, written from the definitions one row at a time: the batched sampler's oracle."""
from __future__ import annotations

import torch

from radixlang.runtime.config import GREEDY_TEMPERATURE
from radixlang.runtime.sampling_params import SamplingParams


def penalized(logits: torch.Tensor, p: SamplingParams, prompt: list[int], output: list[int]) -> torch.Tensor:
    logits = logits.clone()
    counts = torch.zeros_like(logits)
    for t in output:
        counts[t] += 1
    logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).float()
    if p.repetition_penalty != 1.0:
        for t in set(prompt) | set(output):
            x = logits[t]
            logits[t] = x / p.repetition_penalty if x > 0 else x * p.repetition_penalty
    return logits


def filter_probs(probs: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """top-k, then top-p, then min-p, on one request's probabilities; renormalized."""
    if 0 < p.top_k < probs.numel():
        kth = torch.topk(probs, p.top_k).values[-1]
        probs = torch.where(probs < kth, torch.zeros_like(probs), probs)
    if p.top_p < 1.0:
        order = sorted(range(probs.numel()), key=lambda i: -probs[i].item())
        kept, total, head = torch.zeros_like(probs), probs.sum().item(), 0.0
        for i in order:
            if head >= p.top_p * total:
                break
            kept[i] = probs[i]
            head += probs[i].item()
        probs = kept
    if p.min_p > 0.0:
        probs = torch.where(probs < p.min_p * probs.max(), torch.zeros_like(probs), probs)
    return probs / probs.sum()


def distribution(logits: torch.Tensor, p: SamplingParams, prompt: list[int], output: list[int],
                 allowed: torch.Tensor | None, stop_ids: set[int], block_stop: bool) -> torch.Tensor:
    """The distribution one request's next token is drawn from (a one-hot at the argmax when greedy)."""
    logits = penalized(logits, p, prompt, output)
    if allowed is not None:
        logits = logits.masked_fill(~allowed, -torch.inf)
    if block_stop and stop_ids:
        blocked = logits.clone()
        blocked[list(stop_ids)] = -torch.inf
        if torch.isfinite(blocked).any():  # when only stopping is allowed, min_new_tokens yields
            logits = blocked
    if p.temperature < GREEDY_TEMPERATURE or p.top_k == 1:  # greedy: argmax
        return torch.nn.functional.one_hot(logits.argmax(), logits.numel()).float()
    return filter_probs(torch.softmax(logits / p.temperature, dim=-1), p)
