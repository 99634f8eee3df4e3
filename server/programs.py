"""POST /v1/programs: one request runs a whole traced program server-side — its gens, selects and
forks (in parallel) — with the same interpreter the client uses; GET /get_model_info for clients."""
from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ..lang.engine_backend import EngineBackend
from ..lang.executor import ProgramEvent
from ..lang.interpreter import ProgramRun, run_ir
from ..lang.ir import TraceError
from .errors import APIError, error_body, user_errors
from .protocol import ProgramRequest
from .state import ServerState, server_state
from .streaming import SSE_DONE, ClientGone, sse, sse_response, until_disconnect

router = APIRouter()
_USER_ERRORS = (ValueError, TypeError, TraceError)  # a program error the client caused (FieldError included)


@router.post("/v1/programs")
async def run_program(body: ProgramRequest, request: Request) -> Response:
    state = server_state(request)
    state.ensure_open()
    with user_errors({"program": "program", "args": "args"}):
        run = run_ir(body.program, body.args, EngineBackend(state.engine), body.sampling_params)
    if body.stream:
        return sse_response(_event_stream(run))
    try:
        last = await until_disconnect(request, asyncio.to_thread(_last_event, run))
    except ClientGone:
        run.cancel()  # the client left: stop the program and abort its engine requests
        raise
    if last.kind == "error":
        raise APIError(_error_status(state, last), f"the program failed: {last.value}", kind="program_error")
    return JSONResponse(last.to_dict())


@router.get("/get_model_info")
async def model_info(request: Request) -> dict[str, Any]:
    """What a remote client needs to render roles itself (SGLang's route of the same name)."""
    state = server_state(request)
    tok = state.engine.tokenizer
    return {"model_path": state.engine.config.model, "served_model_name": state.model_name,
            "is_generation": True, "context_length": state.engine.context_length,
            "chat_template": tok.chat_template, "bos_token": tok.bos_token, "eos_token": tok.eos_token}


def _last_event(run: ProgramRun) -> ProgramEvent:
    event = None
    for event in run:
        pass
    assert event is not None, "a program run ends with an end or error event"
    return event


def _error_status(state: ServerState, event: ProgramEvent) -> int:
    return 400 if isinstance(event.value, _USER_ERRORS) else state.error_status()


async def _event_stream(run: ProgramRun) -> AsyncIterator[str]:
    """The run's events as SSE. The run blocks a thread of its own while it waits for events;
    if the client goes away, Starlette cancels this generator and the run is cancelled with it."""
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[ProgramEvent | BaseException | None] = asyncio.Queue()

    def put(item: ProgramEvent | BaseException | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody listens any more
            loop.call_soon_threadsafe(inbox.put_nowait, item)

    def pump() -> None:
        try:
            for event in run:
                put(event)
        except Exception as e:  # noqa: BLE001 - reported to the client below
            put(e)
        finally:
            put(None)

    threading.Thread(target=pump, name="radixlang-program", daemon=True).start()
    try:
        while (item := await inbox.get()) is not None:
            if isinstance(item, BaseException):
                yield sse(error_body(500, f"internal error: {item!r}", kind="server_error"))
                break
            yield sse(item.to_dict())
    finally:
        run.cancel()
    yield SSE_DONE
