"""An ASGI middleware that refuses request bodies over a size limit with a 413, without reading them."""
from __future__ import annotations

import json

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import error_body


def _message(max_bytes: int) -> str:
    return f"the request body is larger than this server's limit of {max_bytes} bytes (max_body_bytes)"


class BodyTooLarge(HTTPException):
    """An HTTPException, so FastAPI passes it through its body parsing to the app's error handler."""

    def __init__(self, max_bytes: int):
        super().__init__(413, _message(max_bytes))


class BodySizeLimit:
    """A declared Content-Length over the limit is refused before any of the body is read; a body
    sent without one (chunked) is counted as it arrives and refused once it crosses the limit."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        received, started = 0, False

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except BodyTooLarge:
            if not started:
                await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        body = json.dumps(error_body(413, _message(self.max_bytes))).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
