"""Server-sent events, and tying a request's work to its client's connection."""
from __future__ import annotations

import asyncio
import contextlib
import json
from typing import AsyncIterator, Awaitable, TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse

T = TypeVar("T")
SSE_DONE = "data: [DONE]\n\n"


def sse(obj: object) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def sse_response(events: AsyncIterator[str]) -> StreamingResponse:
    # Starlette cancels `events` when the client disconnects; the engine's stream aborts on cancel.
    return StreamingResponse(events, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


class ClientGone(Exception):
    """The client disconnected before its (non-streaming) response was ready."""


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Awaits `work`, cancelling it (which aborts its engine requests) if the client goes away."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        raise ClientGone()
    return task.result()
