"""The edge's checks: a caller's prompts, sampling params, logprob options, ids and images become
validated `Submission`s. Every check of a request happens here, once."""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .constrained.compiler import ConstraintCompiler
from .image_span import ImageSpan
from .multimodal.prompt import ImagePrompts, images_per_prompt
from .sampling_params import SamplingParams
from .submission import CheckedSampling, Submission, SubmissionBatch, sample_rids
from .tokenizer import Tokenizer

SamplingArg = CheckedSampling | SamplingParams | Mapping[str, Any] | None
Prompts = str | Sequence[str] | None
InputIds = Sequence[int] | Sequence[Sequence[int]] | None


@dataclass
class RequestValidator:
    """Checks requests against one loaded model's limits (vocabulary, context, KV pool, vision)."""

    tokenizer: Tokenizer
    model_name: str
    vocab_size: int
    context_length: int
    pool_size: int
    constraints: ConstraintCompiler
    image_prompts: ImagePrompts | None = None  # None: a text-only model
    share_prefills: bool = True  # False without a radix cache: samples cannot share a prompt's KV

    def sampling(self, params: SamplingArg, names: Mapping[str, str] | None = None) -> CheckedSampling:
        """Validated params (errors name fields as `names` spells them) with the constraint compiled."""
        if isinstance(params, CheckedSampling):
            return params
        checked = SamplingParams.from_any(params)
        checked.validate(self.vocab_size, self.context_length, names=names)
        spec = checked.constraint
        return CheckedSampling(checked, self.constraints.compile(*spec) if spec is not None else None)

    def build(self, prompt: Prompts = None, sampling_params: SamplingArg = None, *, input_ids: InputIds = None,
              return_logprob: bool = False, logprob_start_len: int = -1, top_logprobs_num: int = 0,
              rid: str | Sequence[str] | None = None, image_data: Any = None) -> SubmissionBatch:
        """The requests of one call: one per prompt and sample, prompt-major. `image_data`: a vision
        model's images, one per placeholder (`image_prompts.placeholder`); for a batch, one list per prompt."""
        prompts, single = self._prompt_ids(prompt, input_ids)
        images, starts = self._images(prompts, image_data, logprob_start_len)
        sampling = self.sampling(sampling_params)
        params = sampling.params
        if not isinstance(top_logprobs_num, int) or not 0 <= top_logprobs_num <= self.vocab_size:
            raise ValueError(f"top_logprobs_num must be in [0, {self.vocab_size}], got {top_logprobs_num!r}")
        if not isinstance(logprob_start_len, int) or logprob_start_len < -1:
            raise ValueError(f"logprob_start_len must be an integer >= -1, got {logprob_start_len!r}")
        prompt_rids = self._rids(rid, len(prompts))
        rids = sample_rids(prompt_rids, params.n)
        subs = []
        for i, ids in enumerate(prompts):
            for j in range(params.n):
                subs.append(Submission(rids[i * params.n + j], ids, _sample_params(params, j), return_logprob,
                                       starts[i], top_logprobs_num, sampling.constraint, images[i]))
        return SubmissionBatch(subs, prompt_rids, single, params.n, self._shared_prefills(subs))

    def _images(self, prompts: list[list[int]], image_data: Any,
                logprob_start_len: int) -> tuple[list[list[ImageSpan]], list[int]]:
        """Expands each prompt's image placeholders into spans (in place); returns the spans and each
        prompt's logprob_start_len in the expanded prompt. `image_data`: images of one prompt, or one
        list per prompt."""
        if image_data is None or (isinstance(image_data, (list, tuple)) and not image_data):
            return [[] for _ in prompts], [logprob_start_len] * len(prompts)
        if self.image_prompts is None:
            raise ValueError(f"model {self.model_name!r} has no vision tower, so it takes no images")
        spans, starts = [], []
        for i, (ids, sources) in enumerate(zip(prompts, images_per_prompt(image_data, len(prompts)))):
            where = "image_data" if len(prompts) == 1 else f"image_data[{i}]"
            ids[:], found, start = self.image_prompts.expand(ids, sources, where, logprob_start=logprob_start_len)
            self._check_length(ids)
            spans.append(found)
            starts.append(start)
        return spans, starts

    def _prompt_ids(self, prompt: Prompts, input_ids: InputIds) -> tuple[list[list[int]], bool]:
        if (prompt is None) == (input_ids is None):
            raise ValueError("pass exactly one of prompt and input_ids")
        if prompt is not None:
            single = isinstance(prompt, str)
            texts = [prompt] if single else list(prompt)
            if not all(isinstance(t, str) for t in texts):
                raise ValueError("prompt must be a string or a list of strings")
            batch = [self.tokenizer.encode(t) if t else [] for t in texts]
        else:
            assert input_ids is not None
            single = bool(input_ids) and not isinstance(input_ids[0], (list, tuple))
            batch = [list(input_ids)] if single else [list(x) for x in input_ids]  # type: ignore[arg-type]
        if not batch:
            raise ValueError("no prompts given")
        for ids in batch:
            self._check_prompt(ids)
        return batch, single

    def _check_prompt(self, ids: list[int]) -> None:
        if not ids:
            raise ValueError("prompt is empty")
        if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < self.vocab_size for t in ids):
            raise ValueError(f"input_ids must be token ids in [0, {self.vocab_size})")
        self._check_length(ids)

    def _check_length(self, ids: list[int]) -> None:
        if len(ids) >= self.context_length:
            raise ValueError(
                f"prompt has {len(ids)} tokens; the context holds {self.context_length}, "
                "so a prompt may have at most one token fewer"
            )
        if len(ids) + 1 > self.pool_size:
            raise ValueError(f"prompt has {len(ids)} tokens but the KV pool holds only {self.pool_size}")

    @staticmethod
    def _rids(rid: str | Sequence[str] | None, num_prompts: int) -> list[str]:
        """Each prompt's request id: given (one non-empty, distinct string per prompt) or fresh."""
        if rid is None:
            return [uuid.uuid4().hex for _ in range(num_prompts)]
        given = [rid] if isinstance(rid, str) else list(rid)
        if len(given) != num_prompts or not all(isinstance(r, str) and r for r in given):
            raise ValueError(f"rid must be one non-empty string per prompt ({num_prompts})")
        if len(set(given)) != len(given):
            raise ValueError("rid must be unique within a request (one id per prompt), got duplicates")
        return given

    def _shared_prefills(self, subs: list[Submission]) -> list[Submission]:
        """For n > 1, the prompts computed once up front, so the n samples share their KV."""
        if not self.share_prefills:
            return []
        seen: dict[tuple[int, ...], Submission] = {}
        for s in subs:
            seen.setdefault(tuple(s.prompt_ids), s)
        if len(seen) == len(subs):
            return []
        return [Submission(uuid.uuid4().hex, s.prompt_ids, SamplingParams(max_new_tokens=0), images=s.images)
                for s in seen.values()]


def _sample_params(params: SamplingParams, j: int) -> SamplingParams:
    """Sample j's params: n=1, and a given seed offset by j so samples differ but repeat."""
    if params.n == 1:
        return params
    p = SamplingParams.from_any(params)
    p.n = 1
    p.seed = None if params.seed is None else params.seed + j
    return p
