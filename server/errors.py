"""Errors as JSON bodies: {"error": {"message", "type", "param", "code"}} on every route but Anthropic's
/v1/messages, which answers in its own shape: {"type": "error", "error": {"type", "message"}}.

Schema errors are 422 on the native API (FastAPI's convention) and 400 on /v1 (OpenAI's).
"""
from __future__ import annotations

import contextlib
import logging
import re
from typing import TYPE_CHECKING, Iterator, Mapping

from ..runtime.lora import UnknownAdapter
from ..runtime.validation import FieldError

if TYPE_CHECKING:  # imported where used: the CLI's `generate` imports this module (limits.py) without a server
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response

logger = logging.getLogger(__name__)

_LEADING_NAME = re.compile(r"^([a-z_][a-z0-9_]*)\b")
_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list"}  # pydantic's union-branch labels in a loc


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind


def error_body(status: int, message: str, param: str | None = None,
               kind: str = "invalid_request_error") -> dict:
    return {"error": {"message": _encodable(message), "type": kind, "param": param and _encodable(param),
                      "code": status}}


def _encodable(text: str) -> str:
    """`text` with any lone surrogate (echoed from a client's field name) as a \\udxxx escape."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


# Anthropic's error types by status (its API's documented set)
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                    500: "api_error", 503: "overloaded_error", 529: "overloaded_error"}
ANTHROPIC_PATH = "/v1/messages"


def anthropic_error_body(status: int, message: str) -> dict:
    kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": _encodable(message)}}


def _shaped_body(path: str, status: int, message: str, param: str | None = None,
                 kind: str = "invalid_request_error") -> dict:
    if path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/"):
        return anthropic_error_body(status, message)
    return error_body(status, message, param, kind)


@contextlib.contextmanager
def user_errors(fields: Mapping[str, str]) -> Iterator[None]:
    """Turns the engine's ValueError/TypeError (a bad request) into a 400. A FieldError already names
    the field as the client spelled it; otherwise, when the message starts with a field name in
    `fields` (engine name -> the name the client used), the message and `param` use the client's name.
    A LoRA adapter that is not loaded is a 404."""
    try:
        yield
    except UnknownAdapter as e:
        raise APIError(404, str(e), fields.get("lora", "lora"), kind="not_found_error") from e
    except FieldError as e:
        raise APIError(400, str(e), e.field) from e
    except (ValueError, TypeError) as e:
        message, param = str(e), None
        match = _LEADING_NAME.match(message)
        if match and match.group(1) in fields:
            param = fields[match.group(1)]
            message = param + message[match.end():]
        raise APIError(400, message, param) from e


def _loc_path(loc: tuple) -> str:
    parts = [p for p in loc if p != "body" and not (isinstance(p, str) and ("[" in p or p in _TYPE_TAGS))]
    path = ""
    for p in parts:
        path += f"[{p}]" if isinstance(p, int) else (f".{p}" if path else str(p))
    return path


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    seen: dict[str, None] = {}
    first_param = None
    for err in exc.errors():
        path = _loc_path(tuple(err.get("loc", ())))
        msg = str(err.get("msg", "invalid value"))
        if err.get("type") == "json_invalid":  # its loc is a character position, not a field
            path, msg = "", f"the body is not valid JSON: {err.get('ctx', {}).get('error', msg)}"
        elif err.get("type") == "extra_forbidden":
            msg = "unknown field"
        elif not path and err.get("type") in ("model_attributes_type", "dict_type"):
            msg = "the request body must be a JSON object (Content-Type: application/json)"
        seen.setdefault(f"{path}: {msg}" if path else msg)
        first_param = first_param or path or None
    return "; ".join(list(seen)[:4]), first_param


def install_error_handlers(app: FastAPI) -> None:
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response
    from starlette.exceptions import HTTPException

    from .streaming import ClientGone

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        status = 400 if request.url.path.startswith("/v1/") else 422
        message, param = _validation_message(exc)
        return JSONResponse(_shaped_body(request.url.path, status, message, param), status_code=status)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:  # 404, 405, ...
        return JSONResponse(_shaped_body(request.url.path, exc.status_code, str(exc.detail)),
                            status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        body = _shaped_body(request.url.path, exc.status, exc.message, exc.param, exc.kind)
        return JSONResponse(body, status_code=exc.status)

    @app.exception_handler(ClientGone)
    async def _gone(request: Request, exc: ClientGone) -> Response:
        return Response(status_code=499)  # nginx's "client closed request"; nobody reads it

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("request to %s failed", request.url.path)
        body = _shaped_body(request.url.path, 500, f"internal error: {exc!r}", kind="server_error")
        return JSONResponse(body, status_code=500)
