"""Running a request on the engine for a route: claim its ids, tie it to the connection, map errors."""
from __future__ import annotations

import contextlib
import logging
from typing import Any, AsyncIterator, Callable, Iterable, Mapping

from fastapi import Request

from ..runtime.engine import Completion, Engine
from ..runtime.request import StreamChunk
from ..runtime.submission import CheckedSampling, SubmissionBatch
from .errors import APIError, error_body, user_errors
from .state import ServerState
from .streaming import SSE_DONE, sse, until_disconnect
from .text_input import check_unicode_tree

logger = logging.getLogger(__name__)
Groups = dict[str, list[str]]


async def checked_params(state: ServerState, raw: Mapping[str, Any] | None, fields: Mapping[str, str]
                         ) -> CheckedSampling:
    """Validated sampling params, their constraint compiled on the CPU pool (not on the event loop);
    the engine takes them as they are."""
    for name, value in (raw or {}).items():  # e.g. a stop string would come back in matched_stop
        check_unicode_tree(value, fields.get(name, name))
    with user_errors(fields):
        return await state.offload(state.engine.validator.sampling, raw, fields)


def prepare(state: ServerState, args: Mapping[str, Any], fields: Mapping[str, str]) -> SubmissionBatch:
    """The request's Submissions (`Engine.prepare`'s arguments; sampling_params already checked)."""
    with user_errors(fields):
        return state.engine.prepare(**args)


def length_hint(engine: Engine, prompt_tokens: int, completion_tokens: int, max_new_tokens: int) -> str | None:
    """Why a request stopped for length before its max_new_tokens, if it did."""
    if completion_tokens >= max_new_tokens:
        return None
    if prompt_tokens + completion_tokens >= engine.context_length:
        return (f"stopped after {completion_tokens} of max_new_tokens={max_new_tokens}: prompt and output "
                f"filled the context ({engine.context_length} tokens)")
    return (f"stopped after {completion_tokens} of max_new_tokens={max_new_tokens}: the KV pool "
            f"({engine.pool_size} tokens) could not hold more of this request")


async def run(state: ServerState, request: Request, batch: SubmissionBatch, groups: Groups) -> list[Completion]:
    """Every completion of a non-streaming request, in `generate`'s order. Raises ClientGone if the
    client disconnects first (its requests are aborted), APIError for a failed request."""
    with state.live.claim(groups):
        results = await until_disconnect(request, state.engine.async_run(batch))
    for c in results:
        if c.meta.error is not None:
            raise APIError(state.error_status(), c.meta.error, kind="server_error")
    return results


def open_stream(state: ServerState, batch: SubmissionBatch, groups: Groups) -> AsyncIterator[tuple[int, StreamChunk]]:
    """The engine stream of a streaming request; its ids are checked now so a clash is still a 4xx status."""
    state.live.check(groups)
    return state.engine.async_chunks(batch)


async def events(state: ServerState, groups: Groups, chunks: AsyncIterator[tuple[int, StreamChunk]],
                 render: Callable[[int, StreamChunk], Iterable[dict]],
                 start: Iterable[dict] = (), finish: Callable[[], Iterable[dict]] = lambda: (),
                 with_logprobs: bool = False) -> AsyncIterator[str]:
    """SSE text for a stream: `start` events, `render`'s events per chunk, `finish` events once all
    samples are done, then [DONE]. An engine error ends the stream with an error event instead.
    `with_logprobs`: rendering names tokens (the whole prompt's, with prompt logprobs), so it runs on
    the CPU pool, off the event loop."""
    try:
        with state.live.claim(groups):
            async with contextlib.aclosing(chunks):
                for obj in start:
                    yield sse(obj)
                failed = False
                async for i, chunk in chunks:
                    if chunk.error is not None:
                        yield sse(error_body(state.error_status(), chunk.error, kind="server_error"))
                        failed = True
                        break
                    rendered = await state.offload(render, i, chunk) if with_logprobs else render(i, chunk)
                    for obj in rendered:
                        yield sse(obj)
                if not failed:
                    for obj in finish():
                        yield sse(obj)
    except APIError as e:  # an id was taken between the check and the stream's start
        yield sse(error_body(e.status, e.message, e.param))
    except Exception as e:  # a bug here: still end the stream with a clear error (its requests are aborted)
        logger.exception("stream failed")
        yield sse(error_body(500, f"internal error: {e!r}", kind="server_error"))
    yield SSE_DONE
