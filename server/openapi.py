"""What the OpenAPI spec says the routes return besides their 200: the error body, and SSE streams."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(BaseModel):
    """Every error, on every route: {"error": {"message", "type", "param", "code"}}."""

    error: ErrorDetail


_WHY = {
    400: "A bad request: a field out of range, text that cannot be tokenised, a request over a limit "
         "(schema errors too, on /v1 routes)",
    404: "The model is not served here",
    413: "The request body is larger than the server's max_body_bytes",
    422: "The body does not match the request schema (native routes)",
    500: "The engine failed the request",
    503: "The server is shutting down, or the engine does not answer",
}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorResponse, "description": _WHY[code]} for code in codes}


def streaming_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """A route that answers JSON, or server-sent events (`data: {json}` lines, then `data: [DONE]`)
    when the request sets stream=true; plus its errors."""
    sse = {"text/event-stream": {"schema": {"type": "string", "description": "data: {json} events, "
                                            "ending with data: [DONE]"}}}
    return {200: {"description": "The response; with stream=true, server-sent events", "content": sse}} | \
        error_responses(*codes)
