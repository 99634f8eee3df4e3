"""The FastAPI app around one engine: native, OpenAI and admin routes."""
from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from ..runtime.engine import Engine
from . import lora_api, messages_api, native, openai_api, programs, responses_api, sglang_api, weights_api, worker_api
from .auth import AuthConfig, Authentication, require_admin, tenant_of
from .body_limit import BodySizeLimit
from .config import HEALTH_TIMEOUT_S
from .errors import install_error_handlers
from .limits import ServerLimits
from .metrics import PROMETHEUS_CONTENT_TYPE, render_metrics
from .openapi import error_responses
from .protocol import AbortRequest, ReleaseCacheRequest
from .request_log import RequestLog
from .response_store import ResponseStore
from .state import ServerState, server_state


def create_app(engine: Engine, served_model_name: str | None = None,
               limits: ServerLimits | None = None, incremental_streaming_output: bool = False,
               log_requests: bool = False, auth: AuthConfig | None = None) -> FastAPI:
    """The HTTP API over `engine`. The app does not own the engine: whoever made it shuts it down.
    `log_requests`: log each request's body (truncated) at info level. `auth`: the API keys (server/auth.py);
    None or no keys: an open server, as without."""
    state = ServerState(engine, served_model_name or engine.model_name, limits, incremental_streaming_output)
    app = FastAPI(title="radixlang", lifespan=state.lifespan)
    app.state.server = state
    state.api_keys = auth is not None and auth.enabled
    app.state.responses = ResponseStore()  # /v1/responses kept for previous_response_id
    app.add_middleware(BodySizeLimit, max_bytes=state.limits.max_body_bytes)
    if log_requests:  # a body refused for its size is logged too, as far as read
        app.add_middleware(RequestLog)
    if auth is not None and auth.enabled:  # outermost: a request without a key is refused before its body is read
        app.add_middleware(Authentication, config=auth)
    install_error_handlers(app)
    app.include_router(native.router)
    app.include_router(openai_api.router)
    app.include_router(responses_api.router)
    app.include_router(messages_api.router)
    app.include_router(programs.router)
    app.include_router(sglang_api.router)
    app.include_router(lora_api.router)
    app.include_router(worker_api.router)
    app.include_router(weights_api.router)
    _admin_routes(app)
    return app


def _admin_routes(app: FastAPI) -> None:
    @app.get("/health", responses=error_responses(503))
    async def health(request: Request) -> JSONResponse:
        state = server_state(request)
        if state.draining:
            return JSONResponse({"status": "shutting down"}, status_code=503)
        try:  # the scheduler thread answers between steps; a stuck one does not
            await asyncio.wait_for(state.stats(), HEALTH_TIMEOUT_S)
        except asyncio.TimeoutError:
            return JSONResponse({"status": "engine not responding"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.post("/flush_cache")
    async def flush_cache(request: Request) -> dict[str, Any]:
        """Evicts every cached prefix that no request is using; `success` once the cache is empty."""
        state = server_state(request)
        flushed = await asyncio.to_thread(state.engine.flush_cache)  # waits on the scheduler thread
        return {"success": flushed}

    @app.post("/abort", responses=error_responses(413, 422))
    async def abort(body: AbortRequest, request: Request) -> dict[str, Any]:
        """Aborts a request by its rid (or OpenAI response id), or every request with abort_all (the admin
        key's, on a server with keys); answers how many engine requests (samples) that ended. A tenant
        aborts only its own requests: another's rid counts as unknown."""
        live, tenant = server_state(request).live, tenant_of(request)
        if body.abort_all:
            require_admin(request, "abort_all")
            return {"aborted": live.abort_all()}
        return {"aborted": live.abort(body.rid or "", None if tenant.admin else tenant.id)}

    @app.post("/v1/prompt_cache/release", responses=error_responses(413, 422))
    async def release_prompt_cache(body: ReleaseCacheRequest, request: Request) -> dict[str, Any]:
        """Drops a prompt_cache_key session's pinned sequence now (its tokens return to the LRU);
        answers whether it had one and how many tokens it held."""
        engine = server_state(request).engine
        key = tenant_of(request).scoped(body.prompt_cache_key)  # a tenant releases only its own sessions
        tokens = await asyncio.to_thread(engine.release_cache_key, key)
        return {"released": tokens > 0, "tokens": tokens}

    @app.get("/metrics")
    async def metrics(request: Request) -> PlainTextResponse:
        state = server_state(request)
        stats = await state.stats()
        prompt_tps, generation_tps = state.throughput.rates()
        text = render_metrics(stats, prompt_tps, generation_tps, state.model_name)
        return PlainTextResponse(text, media_type=PROMETHEUS_CONTENT_TYPE)
