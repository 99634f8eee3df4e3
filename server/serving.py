"""A running request tied to its connection: its ids claimed, a disconnect aborting it, engine errors
mapped, its stream rendered as SSE. The routes build and submit the request themselves (validation ->
engine); this module sees only what comes back."""
from __future__ import annotations

import contextlib
import logging
from typing import AsyncGenerator, AsyncIterator, Callable, Coroutine, Iterable

from fastapi import Request

from ..runtime.engine import Completion, Engine
from ..runtime.request import StreamChunk
from .auth import tenant_of
from .errors import APIError, error_body
from .state import ServerState
from .streaming import SSE_DONE, sse, until_disconnect

logger = logging.getLogger(__name__)
Groups = dict[str, list[str]]


def length_hint(engine: Engine, prompt_tokens: int, completion_tokens: int, max_new_tokens: int) -> str | None:
    """Why a request stopped for length before its max_new_tokens, if it did."""
    if completion_tokens >= max_new_tokens:
        return None
    if prompt_tokens + completion_tokens >= engine.context_length:
        return (f"stopped after {completion_tokens} of max_new_tokens={max_new_tokens}: prompt and output "
                f"filled the context ({engine.context_length} tokens)")
    return (f"stopped after {completion_tokens} of max_new_tokens={max_new_tokens}: the KV pool "
            f"({engine.pool_size} tokens) could not hold more of this request")


async def run(state: ServerState, request: Request, completions: Coroutine[object, None, list[Completion]],
              groups: Groups) -> list[Completion]:
    """Awaits a non-streaming request's completions (the route's `engine.async_run(batch)`) with its ids
    claimed. Raises ClientGone if the client disconnects first (its requests are aborted), APIError
    for a failed request."""
    try:
        with state.live.claim(groups, tenant_of(request).id):
            results = await until_disconnect(request, completions)
    finally:
        completions.close()  # an id clash: it never started, so nothing was submitted (else a no-op)
    for c in results:
        if c.meta.error is not None:
            raise APIError(state.error_status(), c.meta.error, kind="server_error")
    return results


async def events(state: ServerState, groups: Groups, chunks: AsyncGenerator[tuple[int, StreamChunk], None],
                 render: Callable[[int, StreamChunk], Iterable[dict]],
                 start: Iterable[dict] = (), finish: Callable[[], Iterable[dict]] = lambda: (),
                 with_logprobs: bool = False, owner: str = "") -> AsyncIterator[str]:
    """SSE text for a stream: `start` events, `render`'s events per chunk, `finish` events once all
    samples are done, then [DONE]. An engine error ends the stream with an error event instead.
    `with_logprobs`: rendering names tokens (the whole prompt's, with prompt logprobs), so it runs on
    the CPU pool, off the event loop. `owner`: the tenant whose ids these are (only it may abort them)."""
    try:
        with state.live.claim(groups, owner):
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
