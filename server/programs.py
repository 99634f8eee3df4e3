"""POST /v1/programs: one request runs a whole traced program server-side — its gens, selects and
forks (in parallel) — with the same interpreter the client uses."""
from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ..lang.engine_backend import EngineBackend
from ..lang.executor import ProgramEvent
from ..lang.interpreter import ProgramRun, run_ir
from ..lang.ir import Arg, Fork, Image, TraceError
from ..lang.ir_json import ProgramIR
from .auth import Tenant, tenant_of
from .errors import APIError, error_body, user_errors
from .image_input import decode_images
from .openapi import streaming_responses
from .protocol import ProgramRequest
from .state import ServerState, server_state
from .streaming import SSE_DONE, sse, sse_response, until_disconnect
from .text_input import check_unicode_tree

router = APIRouter()
_USER_ERRORS = (ValueError, TypeError, TraceError)  # a program error the client caused (FieldError included)


@dataclass(eq=False)
class _Tracked:
    """A run in flight: the server cancels it on shutdown, or once it outlives max_program_seconds."""

    run: ProgramRun
    timed_out: bool = False

    def cancel(self) -> None:
        self.run.cancel()

    def time_out(self) -> None:
        self.timed_out = True
        self.run.cancel()


@router.post("/v1/programs", responses=streaming_responses(400, 413, 422, 503))
async def run_program(body: ProgramRequest, request: Request) -> Response:
    state = server_state(request)
    state.ensure_open()
    run = await state.offload(_start, state, body, tenant_of(request))  # decoding and checking a big IR is CPU work
    if body.stream:
        return sse_response(_event_stream(state, run))
    last = await until_disconnect(request, _last_event(state, run))  # a client that leaves cancels it
    if last.kind == "error":
        raise _failure(state, run, last)
    return JSONResponse(last.to_dict())


def program_states(program: ProgramIR) -> int:
    """States a run creates: the root plus every fork's children (a traced loop is unrolled in the IR)."""
    return 1 + sum(len(op.node.children) for op in program.ops if isinstance(op.node, Fork))


def _start(state: ServerState, body: ProgramRequest, tenant: Tenant) -> _Tracked:
    for param in ("program", "args", "sampling_params"):
        check_unicode_tree(getattr(body, param), param)
    with user_errors({"program": "program", "args": "args"}):
        program = ProgramIR.from_dict(body.program)
        state.limits.check_program_states(program_states(program))
        args = body.args | _image_args(program, body.args)
        backend = EngineBackend(state.engine, tenant.namespace)  # the program reuses its tenant's cache only
        return _Tracked(run_ir(program, args, backend, body.sampling_params))


def _image_args(program: ProgramIR, args: dict[str, Any]) -> dict[str, Any]:
    """The program's image arguments decoded from base64 data URLs: over HTTP an image argument never
    names a file on the server."""
    names = {op.node.source.name for op in program.ops
             if isinstance(op.node, Image) and isinstance(op.node.source, Arg) and op.node.source.name in args}
    images = decode_images([args[n] for n in names], [f"args.{n}" for n in names])
    return dict(zip(names, images))


def _failure(state: ServerState, tracked: _Tracked, event: ProgramEvent) -> APIError:
    if tracked.timed_out:
        return APIError(400, state.limits.program_timeout_message(), "program")
    return APIError(_error_status(state, event), f"the program failed: {event.value}", kind="program_error")


async def _last_event(state: ServerState, run: _Tracked) -> ProgramEvent:
    event = None
    async for event in _events(state, run):
        pass
    assert event is not None, "a program run ends with an end or error event"
    return event


def _error_status(state: ServerState, event: ProgramEvent) -> int:
    return 400 if isinstance(event.value, _USER_ERRORS) else state.error_status()


async def _events(state: ServerState, tracked: _Tracked) -> AsyncIterator[ProgramEvent]:
    """The run's events. The run blocks a thread of its own while it waits for events (not one of the
    event loop's pool: a long program must not starve /health); it is cancelled if this iterator is
    closed early, on shutdown, or once it outlives the server's time limit."""
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[ProgramEvent | BaseException | None] = asyncio.Queue()

    def put(item: ProgramEvent | BaseException | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody listens any more
            loop.call_soon_threadsafe(inbox.put_nowait, item)

    def pump() -> None:
        try:
            for event in tracked.run:
                put(event)
        except Exception as e:  # noqa: BLE001 - reported to the client by the caller
            put(e)
        finally:
            put(None)

    timer = loop.call_later(state.limits.max_program_seconds, tracked.time_out)
    state.programs.add(tracked)
    threading.Thread(target=pump, name="radixlang-program", daemon=True).start()
    try:
        while (item := await inbox.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        tracked.cancel()
        timer.cancel()
        state.programs.discard(tracked)


async def _event_stream(state: ServerState, run: _Tracked) -> AsyncIterator[str]:
    """The run's events as SSE; if the client goes away, Starlette cancels this generator and the run
    is cancelled with it."""
    try:
        async for event in _events(state, run):
            if event.kind == "error" and run.timed_out:
                yield sse(event.to_dict() | {"error": state.limits.program_timeout_message()})
            else:
                yield sse(event.to_dict())
    except Exception as e:  # noqa: BLE001 - a bug: still end the stream with a clear error
        yield sse(error_body(500, f"internal error: {e!r}", kind="server_error"))
    yield SSE_DONE
