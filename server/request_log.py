"""`serve --log-requests`: an ASGI middleware that logs each request's method, path and body (truncated) at
info level, as the body arrives, without changing what the app reads."""
from __future__ import annotations

import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .config import REQUEST_LOG_MAX_CHARS

logger = logging.getLogger("radixlang.server.requests")


class RequestLog:
    def __init__(self, app: ASGIApp, max_chars: int = REQUEST_LOG_MAX_CHARS):
        self.app, self.max_chars = app, max_chars

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        head, total, logged = bytearray(), 0, False

        def log() -> None:
            text = head[:self.max_chars].decode("utf-8", "replace")
            more = f" ... ({total} bytes)" if total > self.max_chars else ""
            logger.info("request %s %s %s%s", scope["method"], scope["path"], text, more)

        async def logging_receive() -> Message:
            nonlocal total, logged
            message = await receive()
            if message["type"] == "http.request" and not logged:
                body = message.get("body", b"")
                total += len(body)
                if len(head) < self.max_chars:
                    head.extend(body[:self.max_chars - len(head)])
                if not message.get("more_body", False):
                    logged = True
                    log()
            return message

        await self.app(scope, logging_receive, send)
        if not logged and scope["method"] in ("GET", "DELETE", "HEAD"):  # a route that never read its (empty) body
            log()
