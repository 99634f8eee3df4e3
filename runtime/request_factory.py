"""Builds a `Req` with its feature state: sampler, constraint position, detokenizer, image-aware text ids."""
from __future__ import annotations

from typing import Callable

import torch

from .constrained.marker_tokens import MarkerTokens
from .constrained.matcher import Constraint, Matcher
from .detokenizer import IncrementalDetokenizer
from .image_span import ImageSpan
from .multimodal.prompt import text_ids
from .request import Req, StreamChunk
from .sampler import SamplingState
from .sampling_params import SamplingParams
from .tokenizer import Tokenizer


def create_req(rid: str, prompt_ids: list[int], params: SamplingParams, tokenizer: Tokenizer,
               sink: Callable[[StreamChunk], None], *, context_length: int, seed: int, device: torch.device,
               return_logprob: bool = False, logprob_start_len: int = -1, top_logprobs_num: int = 0,
               constraint: Constraint | None = None, images: list[ImageSpan] | None = None) -> Req:
    """A request with its sampler, constraint and detokenizer state; `params` must be validated."""
    token_ids = text_ids(prompt_ids) if images else prompt_ids
    sampling = SamplingState.create(params, token_ids, tokenizer.eos_token_ids,
                                    tokenizer.vocab_size, device, seed)
    matcher = None
    if constraint is not None:  # EOS ends a constrained output unless the caller ignores EOS
        end_ids = tuple(i for i in constraint.vocab.end_ids if i in sampling.stop_ids)
        matcher = Matcher(constraint, end_ids)
    return Req(
        rid=rid,
        prompt_ids=prompt_ids,
        params=params,
        sampling=sampling,
        constraint=matcher,
        # a tool call's marker token is the parser's cue: keep its text (the constraint allows no other special)
        detok=IncrementalDetokenizer(tokenizer, params.stop,
                                     params.skip_special_tokens and not isinstance(constraint, MarkerTokens),
                                     trim_stop=not params.no_stop_trim, context_ids=token_ids,
                                     stop_regex=params.stop_regex),
        sink=sink,
        max_new_tokens=min(params.max_new_tokens, context_length - len(prompt_ids)),
        return_logprob=return_logprob,
        logprob_start_len=logprob_start_len,
        top_logprobs_num=top_logprobs_num,
        images=list(images or ()),
    )
