"""After the forward pass: sample the step's rows in one batched call, verify draft trees (speculative and
jump-forward), append tokens, detokenize, stream, draft again, and return which requests are done (the
scheduler applies that: the processor never ends a request itself)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, TypeVar

import torch

from ..batch import Finish, LogitRows, ScheduledItem, StepBatch
from ..constrained.jump_forward import JumpForwarder
from ..constrained.regex.fsa import ConstraintTooLarge
from ..counters import SchedulerCounters
from ..draft_tree import (
    DRAFTER,
    JUMP_FORWARD,
    Draft,
    DraftTree,
    accept_path,
    allowed_tree,
    chain,
    constraint_states,
    paths,
)
from ..emit import emit
from ..kv.kv_manager import KVManager
from ..request import ConstraintCursor, Req
from ..speculative.drafter import Drafter
from .sampler import SampleRow, ScoreRow, StepSamples, TokenLogprob, sample_step

T = TypeVar("T")


@dataclass(slots=True)
class StepResult:
    finished: list[Finish]  # requests that ended this step, in the order they ended
    to_draft: list[Req]  # requests that go on and may get a draft for the next step


class OutputProcessor:
    def __init__(self, kv: KVManager, context_length: int, counters: SchedulerCounters,
                 jump: JumpForwarder | None, drafter: Drafter | None = None):
        self.kv, self.context_length, self.counters = kv, context_length, counters
        self.jump = jump  # None: jump-forward disabled
        self.drafter = drafter  # None: no speculative drafts (jump-forward may still draft)
        self._decided: dict[Req, Finish] = {}  # this step's decisions, in the order they were made

    def process(self, batch: StepBatch, logits: torch.Tensor | None) -> StepResult:
        """Takes the step's tokens; returns the requests that ended (for `Scheduler.apply`) and those
        that go on and may get a draft (for `draft`, once the ended ones are applied)."""
        self._decided = {}
        to_draft = self._process(batch, logits)
        return StepResult(list(self._decided.values()), to_draft)

    def draft(self, reqs: list[Req]) -> list[Finish]:
        """Drafts the next step's tokens of `reqs`; returns any request that ended on the way."""
        self._decided = {}
        if reqs:
            self._draft(reqs)
        return list(self._decided.values())

    def finish(self, req: Req, reason: str, matched: int | str | None = None, error: str | None = None) -> None:
        """Decides that `req` ends (the first decision stands); the scheduler applies it after the step."""
        self._decided.setdefault(req, Finish(req, reason, matched, error))

    def _process(self, batch: StepBatch, logits: torch.Tensor | None) -> list[Req]:
        live = []
        for item, rows in zip(batch.items, batch.rows):
            req = item.req
            if req.done:
                continue
            live.append((item, rows))
            self.kv.computed(req, item.end)
            if item.length > 1 and req.draft is None:  # a draft reaches the tree only once verified
                self.kv.commit(req)
        out = self._sample(live, logits)
        sampled = scored = 0
        going_on: list[Req] = []  # drafted together once every request has its tokens
        for item, rows in live:
            req = item.req
            if req in self._decided:  # its constraint failed while its rows were built: none of them were sampled
                continue
            if rows.prompt:
                n_scores = len(rows.prompt)
                req.input_logprobs += out.score_logprobs[scored:scored + n_scores]
                scored += n_scores
            n = len(rows.samples)  # rows.samples is empty unless item.samples
            if not n:
                if item.completes_fill:  # no room for another token
                    self.finish(req, "length")
                continue
            if req.draft is None:
                going = self._append(req, out.tokens[sampled:sampled + 1], out.sample_logprobs[sampled:sampled + 1])
            else:
                going = self._verify_and_append(req, out.tokens[sampled:sampled + n],
                                                out.sample_logprobs[sampled:sampled + n])
            if going and (self.drafter is not None or (self.jump is not None and req.constraint is not None)):
                going_on.append(req)  # one that may get a draft
            sampled += n
        return going_on

    def _guarded(self, req: Req, work: Callable[..., T], *args) -> T | None:
        """work(*args) on `req`'s constraint, or None after ending `req` alone if a lexer built on first
        use outgrows its bound (the step's other requests go on)."""
        try:
            return work(*args)
        except ConstraintTooLarge as e:
            self.finish(req, "abort", error=str(e))
            return None

    # ---- one batched sampler call -------------------------------------------------------------
    def _sample(self, live: list[tuple[ScheduledItem, LogitRows]], logits: torch.Tensor | None) -> StepSamples:
        sample_rows: list[int] = []
        samples: list[SampleRow] = []
        score_rows: list[int] = []
        scores: list[ScoreRow] = []
        for item, rows in live:
            req = item.req
            if rows.samples:  # item.samples
                if req.draft is None and req.constraint is None:
                    samples.append(self._root_row(req))
                else:
                    own = self._guarded(req, self._sample_rows, req)
                    if own is None:
                        continue
                    samples += own
                sample_rows += rows.samples
            if rows.prompt:
                score_rows += rows.prompt
                scores += [ScoreRow(req.prompt_ids[p + 1], req.top_logprobs_num) for p in item.prompt_logit_positions()]
        if logits is None:
            return StepSamples([], [], [])
        return sample_step(logits, sample_rows, samples, score_rows, scores)

    @staticmethod
    def _root_row(req: Req) -> SampleRow:
        """`_sample_rows` of a request with neither draft nor constraint: its one row."""
        counter = len(req.output_ids)
        return SampleRow(req.sampling, counter, counter < req.params.min_new_tokens, (), None,
                         req.top_logprobs_num if req.return_logprob else -1)

    @staticmethod
    def _sample_rows(req: Req) -> list[SampleRow]:
        """The root's row, then one per draft node: each row assumes the tokens on its path from the
        root were accepted (its constraint state, penalties, min_new_tokens count and place in the
        seed's random stream follow from that)."""
        base = len(req.output_ids)
        drafted = req.draft.tokens if req.draft is not None else []
        parents = req.draft.parents if req.draft is not None else []
        m = req.constraint
        states = constraint_states(m.state, m.constraint.advance, drafted, parents) if m is not None else []
        top = req.top_logprobs_num if req.return_logprob else -1
        rows = []
        for j, path in enumerate(paths(drafted, parents)):
            counter = base + len(path)
            block_stop = counter < req.params.min_new_tokens
            mask = None
            if m is not None:
                mask = m.mask_words(states[j], counter)  # counter: the budget's close (closing.py)
                block_stop = block_stop and not m.is_complete(states[j])  # the constraint may only end
            rows.append(SampleRow(req.sampling, counter, block_stop, path, mask, top))
        return rows

    # ---- drafts and appending -------------------------------------------------------------------
    def _verify_and_append(self, req: Req, drawn: list[int], logprobs: list[TokenLogprob | None]) -> bool:
        """Keeps the draft nodes on the path the target's draws take through the tree (`accept_path`),
        moves their KV into place and frees the rest, then appends them and the bonus token drawn after
        the last kept one."""
        draft, n = req.draft, req.num_draft
        drafted = draft.tokens if draft is not None else []
        path = accept_path(drafted, draft.parents, drawn) if draft is not None else []
        if draft is not None:
            first = len(req.prompt_ids) + len(req.output_ids)  # the root's child's position
            self.kv.keep_path(req, first, [first + i for i in path])
            req.draft = None
            self._count_verify(req, draft.source, n, len(path))
        accepted = [drafted[i] for i in path]
        rows = [0] + [1 + i for i in path]  # the row that drew each accepted token, then the bonus row
        return self._append(req, accepted + [drawn[rows[-1]]], [logprobs[r] for r in rows])

    def _count_verify(self, req: Req, source: str, drafted: int, accepted: int) -> None:
        if source == JUMP_FORWARD:
            self.counters.jump_forward_tokens += accepted
            return
        self.counters.spec_verifies += 1
        self.counters.spec_accepted_tokens += accepted
        if self.drafter is not None:
            self.drafter.verified(req, drafted, accepted)

    def _append(self, req: Req, tokens: list[int], logprobs: list[TokenLogprob | None]) -> bool:
        """Appends the accepted draft tokens, then the bonus token, one at a time until one ends the
        request, as plain decoding would have (a complete constraint without EOS ends it before the
        bonus, which its empty mask made meaningless); streams what was appended in one chunk. Returns
        whether the request goes on."""
        m, output_ids, sampling = req.constraint, req.output_ids, req.sampling
        appended, text = 0, ""
        reason, matched, error = None, None, None
        for token in tokens:
            if m is not None and not m.end_ids and m.is_complete():
                reason = "stop"  # complete before this token (an empty grammar) and no EOS (ignore_eos): its mask was empty
                break
            if m is not None and token not in sampling.stop_ids and m.no_room(m.state, len(output_ids)):
                reason = "length"  # the output could end here and nothing more fits: cut before the token
                break
            if m is not None and (error := _advance(m, token)) is not None:
                reason = "abort"
                break
            output_ids.append(token)
            sampling.observe(token)
            appended += 1
            reason, matched, delta = self._ended(req, token)
            text += delta
            if reason is not None:
                break
        if appended == len(tokens):
            self.counters.generated_tokens += 1  # the bonus token: the one a plain step would decode
        self.kv.truncate(req, req.fill_len)  # KV of accepted tokens after the end is not output
        if appended:
            # a request that asked for logprobs has one for each sampled token: the filter drops nothing
            kept = [lp for lp in logprobs[:appended] if lp is not None] if req.return_logprob else []
            emit(req, text, tokens[:appended], kept)
        if reason is not None:
            self.finish(req, reason, matched=matched, error=error)
        return reason is None

    def _ended(self, req: Req, token: int) -> tuple[str | None, int | str | None, str]:
        """(finish reason or None, what matched, text released) after appending `token`."""
        if token in req.sampling.stop_ids:
            return "stop", token, req.detok.flush()
        n_out = len(req.output_ids)
        result = req.detok.add([token], check_stop=n_out >= req.params.min_new_tokens)
        if result.stop is not None:
            return "stop", result.stop, result.delta
        m = req.constraint
        if n_out >= req.max_new_tokens or req.fill_len >= self.context_length or (
                m is not None and m.closed(m.state, n_out)):  # closed for max_tokens: cut all the same
            return "length", None, result.delta
        if m is not None and not m.end_ids and m.is_complete():
            return "stop", None, result.delta  # complete, and no EOS to sample (ignore_eos)
        return None, None, result.delta

    @staticmethod
    def _allowed(req: Req, tree: DraftTree) -> DraftTree:
        m = req.constraint
        if m is None:
            return allowed_tree(tree, req.sampling.stop_ids, None, None)
        return allowed_tree(tree, req.sampling.stop_ids, m.state, m.constraint.advance)

    def _draft(self, reqs: list[Req]) -> None:
        """Appends draft tokens, checked at the next step: the constraint's forced continuation as a
        one-branch tree, else the drafter's tree (one drafter call for all requests)."""
        wanted: list[tuple[Req, int]] = []
        for req in reqs:
            room = req.max_new_tokens - len(req.output_ids) - 1  # the step after the draft still samples
            if room <= 0:
                continue
            if self.jump is not None and req.constraint is not None:
                forced_bytes = self._guarded(req, req.constraint.forced_bytes)
                if forced_bytes is None:
                    continue
                forced = self.jump.draft(forced_bytes)[:room]
                self.counters.jump_forward_drafted += len(forced)
                if forced:
                    self._set_draft(req, DraftTree(forced, chain(len(forced))), JUMP_FORWARD)
                    continue
            wanted.append((req, room))
        if self.drafter is None or not wanted:
            return
        for (req, _), proposed in zip(wanted, self.drafter.propose(wanted)):
            tree = self._guarded(req, self._allowed, req, proposed)
            if tree is None:
                continue
            self.counters.spec_draft_tokens += len(tree.tokens)
            self._set_draft(req, tree, DRAFTER)

    @staticmethod
    def _set_draft(req: Req, tree: DraftTree, source: str) -> None:
        if tree.tokens:
            req.draft = Draft(list(tree.tokens), list(tree.parents), source)


def _advance(m: ConstraintCursor, token: int) -> str | None:
    """Advances the constraint past `token`; the error that ends the request, if it can't."""
    try:
        if m.advance(token):
            return None
    except ConstraintTooLarge as e:  # a lexer built on first use outgrew its bound
        return str(e)
    return f"internal error: the constraint rejected sampled token {token}"

