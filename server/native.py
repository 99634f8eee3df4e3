"""SGLang's native POST /generate: text or input_ids (one or a batch), sampling_params, logprobs, SSE."""
from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from ..runtime.engine import Collector, Completion, Engine, sample_rids
from ..runtime.meta_info import meta_info
from ..runtime.request import StreamChunk
from ..runtime.sampling_params import SamplingParams
from .errors import APIError, user_errors
from .protocol import GenerateRequest
from .serving import events, open_stream, run
from .state import ServerState, server_state
from .streaming import sse_response

router = APIRouter()

# engine field names as a native client spells them (for error messages)
FIELDS = {f.name: f"sampling_params.{f.name}" for f in dataclasses.fields(SamplingParams)} | {
    name: name for name in ("input_ids", "rid", "top_logprobs_num", "logprob_start_len")}


@router.post("/generate")
async def generate(body: GenerateRequest, request: Request) -> Response:
    state = server_state(request)
    state.ensure_open()
    engine = state.engine
    prompts, single = _prompt_ids(engine, body)
    with user_errors(FIELDS):
        params = SamplingParams.from_any(body.sampling_params)
        params.validate(engine.vocab_size, engine.context_length, names=FIELDS)
    rids = _rids(body.rid, len(prompts))
    groups = {r: sample_rids([r], params.n) for r in rids}
    args = dict(input_ids=prompts, sampling_params=params, return_logprob=body.return_logprob,
                logprob_start_len=body.logprob_start_len, top_logprobs_num=body.top_logprobs_num, rid=rids)
    started = time.perf_counter()
    if body.stream:
        chunks = open_stream(state, args, groups, FIELDS)
        return sse_response(_events(state, body, prompts, params.n, groups, chunks, started))
    results = await run(state, request, args, groups, FIELDS)
    items = [_response(engine, body, prompts[i // params.n], c, True, started) for i, c in enumerate(results)]
    return JSONResponse(items[0] if single and params.n == 1 else items)


def _prompt_ids(engine: Engine, body: GenerateRequest) -> tuple[list[list[int]], bool]:
    """Token ids of each prompt (tokenized here, as the engine would, so logprobs can name them)."""
    if body.text is not None:
        texts = [body.text] if isinstance(body.text, str) else body.text
        return [engine.tokenizer.encode(t) if t else [] for t in texts], isinstance(body.text, str)
    ids = body.input_ids
    single = bool(ids) and isinstance(ids[0], int)
    return ([ids] if single else ids), single  # type: ignore[list-item, return-value]


def _rids(rid: str | list[str] | None, num_prompts: int) -> list[str]:
    if rid is None:
        return [uuid.uuid4().hex for _ in range(num_prompts)]
    given = [rid] if isinstance(rid, str) else rid
    if len(given) != num_prompts or not all(given):
        raise APIError(400, f"rid must be one non-empty string per prompt ({num_prompts})", "rid")
    if len(set(given)) != len(given):
        raise APIError(400, "request ids must be unique within a request", "rid")
    return given


def _response(engine: Engine, body: GenerateRequest, prompt_ids: list[int], c: Completion,
              finished: bool, started: float) -> dict[str, Any]:
    meta = meta_info(engine.tokenizer, c.meta, finished=finished, e2e_latency=time.perf_counter() - started,
                     return_logprob=body.return_logprob, with_text=body.return_text_in_logprobs,
                     prompt_ids=prompt_ids, logprob_start_len=body.logprob_start_len,
                     input_logprobs=c.meta.input_logprobs, output_logprobs=c.meta.output_logprobs)
    return {"text": c.text, "output_ids": c.output_ids, "meta_info": meta}


def _events(state: ServerState, body: GenerateRequest, prompts: list[list[int]], n: int,
            groups: dict[str, list[str]], chunks: AsyncIterator[tuple[int, StreamChunk]],
            started: float) -> AsyncIterator[str]:
    """Like SGLang: each event carries the text, ids and logprobs so far, plus `index` in the batch."""
    collectors: dict[int, Collector] = {}

    def render(i: int, chunk: StreamChunk) -> list[dict]:
        collector = collectors.setdefault(i, Collector())
        collector.add(chunk)
        c = collector.result(chunk, body.return_logprob)
        return [_response(state.engine, body, prompts[i // n], c, chunk.finished, started) | {"index": i}]

    return events(state, groups, chunks, render)
