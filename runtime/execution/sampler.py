"""One batched sampler call per step: penalties, constraint bitmask, temperature, top-k/p, min-p, seeds.

Every row is processed on the device at once, and the step's tokens and log-probabilities reach the
host in one copy (`to_host`). Randomness is counter-based: a row draws the uniform number
hash(seed, index of the token in the request's output), so a request's samples depend on its seed
alone, not on what else shares the batch, on preemption, or on whether jump-forward drafted the token.
Log-probabilities are reported from the raw model distribution (before any processing), like vLLM.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from ..config import GREEDY_TEMPERATURE
from ..sampling_params import SamplingParams

SEED_MASK = (1 << 63) - 1


def is_greedy(params: SamplingParams) -> bool:
    """Whether a request samples by argmax: a temperature that low, or top_k = 1."""
    return params.temperature < GREEDY_TEMPERATURE or params.top_k == 1


@dataclass(slots=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # the top-k alternatives as (token_id, logprob), best first


@dataclass(slots=True)
class SamplingState:
    """Per-request sampler state that survives across steps."""

    params: SamplingParams
    seed: int
    stop_ids: frozenset[int]  # tokens that end generation (EOS unless ignore_eos, plus stop_token_ids)
    token_counts: torch.Tensor | None = None  # [vocab] output-token counts (frequency/presence)
    seen: torch.Tensor | None = None  # [vocab] bool: in prompt or output (repetition penalty)
    bias: tuple[torch.Tensor, torch.Tensor] | None = None  # logit_bias: (token ids, values), added to logits

    @classmethod
    def create(cls, params: SamplingParams, prompt_ids: list[int], eos_ids: tuple[int, ...],
               vocab_size: int, device: torch.device, seed: int) -> "SamplingState":
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids.update(eos_ids)
        state = cls(params, seed & SEED_MASK, frozenset(stop_ids))
        if params.frequency_penalty or params.presence_penalty:
            state.token_counts = torch.zeros(vocab_size, device=device)
        if params.repetition_penalty != 1.0:
            state.seen = torch.zeros(vocab_size, dtype=torch.bool, device=device)
            state.seen[torch.tensor(prompt_ids, device=device)] = True
        if params.logit_bias:
            state.bias = (torch.tensor([int(t) for t in params.logit_bias], dtype=torch.int64, device=device),
                          torch.tensor(list(params.logit_bias.values()), dtype=torch.float32, device=device))
        return state

    @property
    def penalized(self) -> bool:
        return self.token_counts is not None or self.seen is not None

    def observe(self, token_id: int) -> None:
        if self.token_counts is not None:
            self.token_counts[token_id] += 1
        if self.seen is not None:
            self.seen[token_id] = True


@dataclass(slots=True)
class SampleRow:
    """What the sampler needs to know about one row it samples."""

    state: SamplingState
    counter: int  # the token's index in the request's output: its place in the seed's random stream
    block_stop: bool = False  # before min_new_tokens: stop tokens only when nothing else is allowed
    assumed: tuple[int, ...] = ()  # draft tokens this row assumes were output already (for penalties)
    mask: np.ndarray | None = None  # int32 [ceil(vocab/32)] allowed-token bits (constraint); None: all
    top_logprobs: int = -1  # -1: no log-probabilities; else also report this many alternatives

    @property
    def plain_greedy(self) -> bool:
        """Greedy with nothing that changes the logits first and no log-probabilities: a bare argmax."""
        return (is_greedy(self.state.params) and self.mask is None and not self.block_stop
                and not self.state.penalized and self.state.bias is None and self.top_logprobs < 0)


@dataclass(slots=True)
class ScoreRow:
    """A row whose next token is known (a prompt token): only its log-probability is reported."""

    target: int
    top_logprobs: int


@dataclass(slots=True)
class StepSamples:
    tokens: list[int]  # one per sampled row
    sample_logprobs: list[TokenLogprob | None]  # one per sampled row
    score_logprobs: list[TokenLogprob]  # one per scored row


def to_host(t: torch.Tensor) -> list:
    """The step's one device-to-host copy (ints from an integer tensor, else floats)."""
    return t.cpu().tolist()


def sample_step(logits: torch.Tensor, sample_rows: list[int], samples: list[SampleRow],
                score_rows: list[int], scores: list[ScoreRow]) -> StepSamples:
    """Samples rows `sample_rows` of `logits` [rows, vocab] and scores rows `score_rows`; `logits` may be
    modified in place."""
    if samples and not scores and all(s.plain_greedy for s in samples):
        return _greedy_step(logits, sample_rows)
    device = logits.device
    lp_sample = [i for i, s in enumerate(samples) if s.top_logprobs >= 0]
    lp_rows = [sample_rows[i] for i in lp_sample] + score_rows
    raw = torch.log_softmax(logits[_index(lp_rows, device)].float(), dim=-1) if lp_rows else None
    parts: list[torch.Tensor] = []
    if samples:
        rows = logits if len(sample_rows) == logits.shape[0] else logits[_index(sample_rows, device)]
        tokens = sample_tokens(rows.float(), samples)
        parts.append(tokens.double())
    top_k = max([samples[i].top_logprobs for i in lp_sample] + [s.top_logprobs for s in scores], default=0)
    if raw is not None:
        targets = torch.cat((tokens[_index(lp_sample, device)], _index([s.target for s in scores], device))) \
            if lp_sample else _index([s.target for s in scores], device)
        parts.append(raw.gather(1, targets.view(-1, 1)).squeeze(1).double())
        if top_k > 0:
            values, indices = torch.topk(raw, top_k, dim=-1)
            parts += [indices.flatten().double(), values.flatten().double()]
    host = to_host(torch.cat(parts)) if parts else []
    return _unpack(host, samples, lp_sample, scores, top_k)


def _greedy_step(logits: torch.Tensor, sample_rows: list[int]) -> StepSamples:
    """`sample_step` for rows that are all `plain_greedy`: one argmax, its tokens the host copy."""
    rows = logits if len(sample_rows) == logits.shape[0] else logits[_index(sample_rows, logits.device)]
    tokens = to_host(rows.argmax(dim=-1))
    return StepSamples(tokens, [None] * len(tokens), [])


def _unpack(host: list[float], samples: list[SampleRow], lp_sample: list[int], scores: list[ScoreRow],
            top_k: int) -> StepSamples:
    n, m = len(samples), len(lp_sample) + len(scores)
    tokens = [int(t) for t in host[:n]]
    chosen = host[n:n + m]
    ids, values = host[n + m:n + m + m * top_k], host[n + m + m * top_k:]
    wanted = [samples[i].top_logprobs for i in lp_sample] + [s.top_logprobs for s in scores]
    targets = [tokens[i] for i in lp_sample] + [s.target for s in scores]
    entries = []
    for r, (target, k) in enumerate(zip(targets, wanted)):
        top = [(int(ids[r * top_k + j]), values[r * top_k + j]) for j in range(k)]
        entries.append(TokenLogprob(target, chosen[r], top))
    sample_lps: list[TokenLogprob | None] = [None] * n
    for i, entry in zip(lp_sample, entries):
        sample_lps[i] = entry
    return StepSamples(tokens, sample_lps, entries[len(lp_sample):])


def sample_tokens(logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
    """[rows, vocab] float logits -> [rows] int64 tokens, on the device (no host sync)."""
    device = logits.device
    process_logits(logits, rows)
    best = logits.argmax(dim=-1)
    greedy = [is_greedy(s.state.params) for s in rows]
    if all(greedy):
        return best
    probs = token_distribution(logits, [s.state.params for s in rows])
    cum = probs.cumsum(dim=-1)
    u = uniform(_index([s.state.seed for s in rows], device), _index([s.counter for s in rows], device))
    target = (u * cum[:, -1].double()).float().unsqueeze(1)
    drawn = torch.searchsorted(cum, target, right=True).squeeze(1).clamp_(max=logits.shape[1] - 1)
    return torch.where(torch.tensor(greedy, device=device), best, drawn)


def process_logits(logits: torch.Tensor, rows: list[SampleRow]) -> None:
    """logit_bias, penalties, then the constraint mask, then min_new_tokens' stop blocking; in place."""
    apply_logit_bias(logits, rows)
    apply_penalties(logits, rows)
    apply_bitmask(logits, rows)
    block_stop_tokens(logits, rows)


def apply_logit_bias(logits: torch.Tensor, rows: list[SampleRow]) -> None:
    """OpenAI's / SGLang's logit_bias: each listed token's logit plus its bias, in place."""
    for i, s in enumerate(rows):
        if s.state.bias is not None:
            ids, values = s.state.bias
            logits[i].index_add_(0, ids, values.to(logits.dtype))


def apply_penalties(logits: torch.Tensor, rows: list[SampleRow]) -> None:
    """OpenAI's frequency/presence penalties and the CTRL repetition penalty, in place."""
    which = [i for i, s in enumerate(rows) if s.state.penalized]
    if not which:
        return
    device, vocab = logits.device, logits.shape[1]
    counts = torch.zeros(len(which), vocab, device=device)
    seen = torch.zeros(len(which), vocab, dtype=torch.bool, device=device)
    for j, i in enumerate(which):
        s = rows[i].state
        if s.token_counts is not None:
            counts[j] = s.token_counts
        if s.seen is not None:
            seen[j] = s.seen
    extra = [(j, t) for j, i in enumerate(which) for t in rows[i].assumed]
    if extra:
        r, t = _index([e[0] for e in extra], device), _index([e[1] for e in extra], device)
        counts.index_put_((r, t), torch.ones(len(extra), device=device), accumulate=True)
        seen[r, t] = True
    params = [rows[i].state.params for i in which]
    freq = torch.tensor([p.frequency_penalty for p in params], device=device)[:, None]
    pres = torch.tensor([p.presence_penalty for p in params], device=device)[:, None]
    rep = torch.tensor([p.repetition_penalty for p in params], device=device)[:, None]
    seen &= torch.tensor([rows[i].state.seen is not None for i in which], device=device)[:, None]
    x = logits[_index(which, device)]
    x = x - freq * counts - pres * (counts > 0).float()
    x = torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)
    logits[_index(which, device)] = x


@functools.lru_cache(maxsize=8)
def _bit_index(vocab: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    token = torch.arange(vocab, device=device)
    return token >> 5, (token & 31).to(torch.int32)


def apply_bitmask(logits: torch.Tensor, rows: list[SampleRow]) -> None:
    """Constraint masks: one [rows, ceil(vocab/32)] int32 bitmask, one host-to-device copy, in place."""
    if all(s.mask is None for s in rows):
        return
    vocab = logits.shape[1]
    bits = np.full((len(rows), (vocab + 31) // 32), -1, dtype=np.int32)
    for i, s in enumerate(rows):
        if s.mask is not None:
            bits[i] = s.mask
    if logits.device.type == "cpu":  # numpy unpacks bits by table: 10x torch's gather of each token's word
        refused = np.unpackbits(~bits.view(np.uint8), axis=1, count=vocab, bitorder="little").view(bool)
        logits.masked_fill_(torch.from_numpy(refused), -torch.inf)
        return
    word, bit = _bit_index(vocab, logits.device)
    allowed = (torch.from_numpy(bits).to(logits.device)[:, word] >> bit) & 1
    logits.masked_fill_(allowed == 0, -torch.inf)


def block_stop_tokens(logits: torch.Tensor, rows: list[SampleRow]) -> None:
    """Before min_new_tokens, stop tokens are forbidden, unless they are all that is allowed."""
    pairs = [(i, t) for i, s in enumerate(rows) if s.block_stop for t in s.state.stop_ids]
    if not pairs:
        return
    device = logits.device
    r, t = _index([p[0] for p in pairs], device), _index([p[1] for p in pairs], device)
    saved = logits[r, t]
    logits[r, t] = -torch.inf
    dead = ~torch.isfinite(logits[r]).any(dim=1)  # only stopping was allowed: min_new_tokens yields
    logits[r, t] = torch.where(dead, saved, logits[r, t])


def token_distribution(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """softmax(logits / temperature), then top-k, top-p and min-p, per row; unnormalized [rows, vocab]."""
    device, vocab = logits.device, logits.shape[1]
    temp = torch.tensor([p.temperature if not is_greedy(p) else 1.0 for p in params], device=device)
    probs = torch.softmax(logits / temp[:, None], dim=-1)
    top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    top_p = [p.top_p for p in params]
    if any(k < vocab for k in top_k) or any(p < 1.0 for p in top_p):
        k_max = max(top_k)
        if k_max < vocab:  # every row keeps at most k_max tokens: order only those (a full sort is slow)
            sorted_probs, order = torch.topk(probs, k_max, dim=-1)
        else:
            sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        kth = sorted_probs.gather(1, _index([k - 1 for k in top_k], device).view(-1, 1))
        sorted_probs = torch.where(sorted_probs < kth, torch.zeros_like(sorted_probs), sorted_probs)
        cum = sorted_probs.cumsum(dim=-1)
        p = torch.tensor(top_p, device=device)[:, None]
        drop = (cum - sorted_probs) >= p * cum[:, -1:]  # keep the smallest head reaching top_p
        sorted_probs = torch.where(drop, torch.zeros_like(sorted_probs), sorted_probs)
        probs = torch.zeros_like(probs).scatter_(1, order, sorted_probs)
    min_p = [p.min_p for p in params]
    if any(m > 0.0 for m in min_p):
        floor = torch.tensor(min_p, device=device)[:, None] * probs.max(dim=-1, keepdim=True).values
        probs = torch.where(probs < floor, torch.zeros_like(probs), probs)
    return probs


_MIX1, _MIX2 = 0xBF58476D1CE4E5B9 - (1 << 64), 0x94D049BB133111EB - (1 << 64)
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _splitmix(x: torch.Tensor) -> torch.Tensor:
    x = (x ^ _shr(x, 30)) * _MIX1
    x = (x ^ _shr(x, 27)) * _MIX2
    return x ^ _shr(x, 31)


def uniform(seeds: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """A float64 in (0, 1) per row from (seed, counter): splitmix64 twice, on the device."""
    x = _splitmix(_splitmix(seeds * _GOLDEN) + counters * _GOLDEN)
    return (_shr(x, 11).double() + 0.5) / float(1 << 53)


def _index(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=device)
