"""After the forward pass: sample the step's rows in one batched call, verify jump-forward drafts, append
tokens, detokenize, stream, and say which requests are done."""
from __future__ import annotations

from typing import Callable

import torch

from .batch import LogitRows, ScheduledItem, StepBatch
from .constrained.jump_forward import JumpForwarder
from .kv_manager import KVManager
from .request import Req, StreamChunk
from .sampler import SampleRow, ScoreRow, StepSamples, TokenLogprob, sample_step
from .counters import SchedulerCounters

FinishFn = Callable[..., None]  # (req, reason, matched=None, error=None)


class OutputProcessor:
    def __init__(self, kv: KVManager, context_length: int, counters: SchedulerCounters, finish: FinishFn,
                 jump: JumpForwarder | None):
        self.kv, self.context_length, self.counters, self.finish = kv, context_length, counters, finish
        self.jump = jump  # None: jump-forward disabled

    def process(self, batch: StepBatch, logits: torch.Tensor | None) -> None:
        live = [(item, rows) for item, rows in zip(batch.items, batch.rows) if not item.req.done]
        for item, _ in live:
            self.kv.computed(item.req, item.end)
            if item.length > 1:
                self.kv.commit(item.req)
        out = self._sample(live, logits)
        sampled = scored = 0
        for item, rows in live:
            req = item.req
            n_scores = len(rows.prompt)
            req.input_logprobs += out.score_logprobs[scored:scored + n_scores]
            scored += n_scores
            if not item.completes_fill:
                continue
            if not item.samples:
                self.finish(req, "length")
                continue
            n = len(rows.samples)
            self._verify_and_append(req, out.tokens[sampled:sampled + n], out.sample_logprobs[sampled:sampled + n])
            sampled += n

    # ---- one batched sampler call -------------------------------------------------------------
    def _sample(self, live: list[tuple[ScheduledItem, LogitRows]], logits: torch.Tensor | None) -> StepSamples:
        sample_rows, samples, score_rows, scores = [], [], [], []
        for item, rows in live:
            req = item.req
            score_rows += rows.prompt
            scores += [ScoreRow(req.prompt_ids[p + 1], req.top_logprobs_num) for p in item.prompt_logit_positions()]
            if item.samples:
                sample_rows += rows.samples
                samples += self._sample_rows(req)
        if logits is None:
            return StepSamples([], [], [])
        return sample_step(logits, sample_rows, samples, score_rows, scores)

    @staticmethod
    def _sample_rows(req: Req) -> list[SampleRow]:
        """A row per draft token, then one for the token after the draft: row j assumes drafts [0, j)
        were accepted (its constraint state, penalties and min_new_tokens count follow from that)."""
        base = len(req.output_ids) - req.num_draft
        drafted = req.output_ids[base:]
        m = req.constraint
        states = m.lookahead(drafted) if m is not None else [None] * (len(drafted) + 1)
        top = req.top_logprobs_num if req.return_logprob else -1
        rows = []
        for j, state in enumerate(states):
            block_stop = base + j < req.params.min_new_tokens
            mask = None
            if m is not None:
                mask = m.mask_words(state)
                block_stop = block_stop and not m.is_complete(state)  # the constraint may only end
            rows.append(SampleRow(req.sampling, base + j, block_stop, tuple(drafted[:j]), mask, top))
        return rows

    # ---- drafts and appending -------------------------------------------------------------------
    def _verify_and_append(self, req: Req, tokens: list[int], logprobs: list[TokenLogprob | None]) -> None:
        """Keeps each jump-forward draft token while the token sampled at its position reproduces it
        (greedy: the argmax; sampling: a draw, so the output distribution is unchanged), then takes
        the sampled token after the last kept one."""
        base = len(req.output_ids) - req.num_draft
        drafted, accepted, kept_lps = req.output_ids[base:], [], []
        token, token_lp = None, None
        for j, d in enumerate(drafted):
            if tokens[j] != d:  # the model splits or goes on differently: roll the rest back
                self.kv.truncate(req, len(req.prompt_ids) + base + j)
                token, token_lp = tokens[j], logprobs[j]
                break
            accepted.append(d)
            if req.return_logprob:
                kept_lps.append(logprobs[j])
            req.sampling.observe(d)
            advanced = req.constraint.advance(d)
            assert advanced, "a drafted token follows the constraint"
        del req.output_ids[base:]
        req.num_draft = 0
        self.counters.jump_forward_tokens += len(accepted)
        m = req.constraint
        if token is None and not (m is not None and not m.end_ids and m.is_complete()):
            token, token_lp = tokens[-1], logprobs[-1]  # else nothing, not even EOS, may follow
        self._append(req, token, token_lp, accepted, kept_lps)

    def _append(self, req: Req, token: int | None, token_lp: TokenLogprob | None, accepted: list[int],
                logprobs: list[TokenLogprob]) -> None:
        """Appends verified draft tokens and the sampled token (None: the constraint is complete and
        nothing was sampled); streams them; finishes the request when they end it."""
        if token is not None and req.constraint is not None and not req.constraint.advance(token):
            self.finish(req, "abort", error=f"internal error: the constraint rejected sampled token {token}")
            return
        req.output_ids.extend(accepted)
        new = list(accepted)
        if token is not None:
            req.output_ids.append(token)
            req.sampling.observe(token)
            self.counters.generated_tokens += 1
            new.append(token)
            if req.return_logprob:
                logprobs = logprobs + [token_lp]
        p, n_out = req.params, len(req.output_ids)
        ended = token in req.sampling.stop_ids
        result = req.detok.add(accepted if ended else new, check_stop=n_out >= p.min_new_tokens)
        if ended and result.stop is None:
            emit(req, result.delta + req.detok.flush(), new, logprobs)
            self.finish(req, "stop", matched=token)
            return
        emit(req, result.delta, new, logprobs)
        if result.stop is not None:
            self.finish(req, "stop", matched=result.stop)
        elif n_out >= req.max_new_tokens or req.fill_len >= self.context_length:
            self.finish(req, "length")
        elif req.constraint is not None and not req.constraint.end_ids and req.constraint.is_complete():
            self.finish(req, "stop")  # complete, and no EOS to sample (ignore_eos)
        elif self.jump is not None and req.constraint is not None:
            self._draft(req)

    def _draft(self, req: Req) -> None:
        """Appends the constraint's forced continuation as draft tokens, checked at the next step."""
        room = req.max_new_tokens - len(req.output_ids) - 1  # the step after the draft still samples
        tokens = self.jump.draft(req.constraint.forced_bytes())[:max(room, 0)]
        if tokens:
            req.output_ids.extend(tokens)
            req.num_draft = len(tokens)
            self.counters.jump_forward_drafted += len(tokens)


def emit(req: Req, text: str, token_ids: list[int], logprobs: list[TokenLogprob]) -> None:
    first = req.input_logprobs if req.return_logprob and len(req.output_ids) == 1 else None
    req.sink(StreamChunk(req.rid, text, token_ids, logprobs, prompt_tokens=len(req.prompt_ids),
                         cached_tokens=req.cached_tokens, completion_tokens=len(req.output_ids),
                         input_logprobs=first))


def emit_final(req: Req, reason: str, matched: int | str | None = None, error: str | None = None,
               text: str = "") -> None:
    req.sink(StreamChunk(
        rid=req.rid, text=text, token_ids=[], logprobs=[], finished=True, finish_reason=reason,
        matched_stop=matched, error=error, prompt_tokens=len(req.prompt_ids),
        cached_tokens=req.cached_tokens, completion_tokens=len(req.output_ids),
        input_logprobs=req.input_logprobs if req.return_logprob and not req.output_ids else None,
    ))
