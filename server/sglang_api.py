"""The rest of SGLang's native API that its clients call (`sglang.RuntimeEndpoint`, `sglang.Runtime`,
the router): model and server info, the fork join hint, a generating health check.

/generate itself is native.py.
"""
from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path
from typing import Any, Callable, TypeVar

from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from ..lang.hosted import version
from ..runtime.engine import Engine
from ..runtime.models.loading.loader import model_identity
from ..runtime.profiler import ProfileSpec
from .config import HEALTH_TIMEOUT_S
from .errors import APIError
from .openapi import error_responses
from .protocol import ConcatenateRequest, ProfileRequest
from .sglang_fields import check_profile_extras
from .state import server_state
from .worker_api import load_entry

router = APIRouter()
T = TypeVar("T")


@router.get("/get_model_info")
@router.get("/model_info")
async def model_info(request: Request) -> dict[str, Any]:
    """SGLang's model info (its RuntimeEndpoint picks a chat template by model_path), plus what our own
    Endpoint client needs to render roles itself (chat_template, bos / eos tokens, image placeholder)."""
    state = server_state(request)
    tok, images = state.engine.tokenizer, state.engine.image_prompts
    path = state.engine.model_path
    model_type, architectures = model_identity(Path(path))  # from config.json, or a GGUF's architecture
    return {"model_path": path, "tokenizer_path": path, "served_model_name": state.model_name,
            "model_type": model_type, "architectures": architectures and list(architectures),
            "is_generation": True, "has_image_understanding": images is not None,
            "has_audio_understanding": False, "context_length": state.engine.context_length,
            # SGLang's, at the values of a server without those features: no server-side default sampling
            # params, no prefill/decode split; the weights' version as the last update named it
            "preferred_sampling_params": None, "weight_version": state.engine.weight_version,
            "disaggregation_mode": "null",
            "chat_template": tok.chat_template, "bos_token": tok.bos_token, "eos_token": tok.eos_token,
            "image_token": images.placeholder if images else None}


@router.get("/get_server_info")
@router.get("/server_info")
async def server_info(request: Request) -> dict[str, Any]:
    """The engine's configuration as resolved (SGLang's server arguments, as far as its clients and router
    read them), the server's limits, and the live counters and load."""
    state = server_state(request)
    engine = state.engine
    config = {k: v for k, v in dataclasses.asdict(engine.config).items() if _plain(v)}
    live = {**await state.stats(), **await load_entry(state)}  # the scheduler's counters and SGLang's load
    return {**config, "model_path": state.engine.model_path, "tokenizer_path": state.engine.model_path,
            "served_model_name": state.model_name, "host": request.url.hostname, "port": request.url.port,
            "dp_size": engine.config.dp_size(), "is_embedding": False, "context_length": engine.context_length,
            "max_total_num_tokens": engine.pool_size, "limits": dataclasses.asdict(state.limits),
            "internal_states": [live], "version": version(), "frontend": "python", "pid": os.getpid(),
            "incremental_streaming_output": state.incremental_streaming_output,
            "decode_compile": _decode_compile(engine)}


def _decode_compile(engine: Engine) -> str:
    """The background compile of the decode forward (runtime/models/compiled.py): "off", "compiling" (decode
    is eager meanwhile, and the compile takes CPU), "ready" (it serves decode), or "failed" / "cancelled"
    (stopped before it finished, as by a shutdown): eager for good."""
    return "off" if engine.decode_compile is None else engine.decode_compile.state


@router.post("/concate_and_append_request", responses=error_responses(413, 422))
async def concatenate_and_append(body: ConcatenateRequest) -> dict[str, Any]:
    """SGLang's fork join `concate_and_append` (parallel encoding). Its client names the fork's states by
    its own ids, which never reach this server, and sends the joined text with its next request anyway.
    That request reuses the shared prefix (and the first branch) from the radix cache and computes the
    rest at its real positions, so its output is exact: there is no KV to splice here."""
    return {"success": True, "src_rids": body.src_rids, "dst_rid": body.dst_rid,
            "message": "joined text is served from the radix cache by the next request"}


@router.get("/health_generate", responses=error_responses(503))
async def health_generate(request: Request) -> JSONResponse:
    """Healthy once the engine generates a token (SGLang's Runtime waits on this route)."""
    state = server_state(request)
    if state.draining:
        return JSONResponse({"status": "shutting down"}, status_code=503)
    batch = state.engine.prepare(input_ids=[state.engine.tokenizer.bos_token_id or 0],
                                 sampling_params={"max_new_tokens": 1, "temperature": 0.0})
    try:
        [out] = await asyncio.wait_for(state.engine.async_run(batch), HEALTH_TIMEOUT_S)
    except asyncio.TimeoutError:
        return JSONResponse({"status": "engine not responding"}, status_code=503)
    if out.meta.error is not None:
        return JSONResponse({"status": f"generation failed: {out.meta.error}"}, status_code=503)
    return JSONResponse({"status": "ok"})


# GET and POST, as SGLang takes both; one operation id each, so the OpenAPI spec has no duplicates
@router.get("/start_profile", operation_id="start_profile_get", responses=error_responses(400, 422))
@router.post("/start_profile", operation_id="start_profile", responses=error_responses(400, 422))
async def start_profile(request: Request, body: ProfileRequest | None = Body(None)) -> PlainTextResponse:
    """SGLang's: torch.profiler over the scheduler's steps until /stop_profile (or num_steps steps)."""
    body = body or ProfileRequest()
    check_profile_extras(body)
    given = body.model_dump(exclude_none=True, include={f.name for f in dataclasses.fields(ProfileSpec)})
    spec = ProfileSpec(**given | ({"activities": tuple(body.activities)} if body.activities is not None else {}))
    path = await _profiler_call(request, server_state(request).engine.start_profile, spec)
    return PlainTextResponse(f"Start profiling. The trace will be written to {path}\n")


@router.get("/stop_profile", operation_id="stop_profile_get", responses=error_responses(400))
@router.post("/stop_profile", operation_id="stop_profile", responses=error_responses(400))
async def stop_profile(request: Request) -> PlainTextResponse:
    path = await _profiler_call(request, server_state(request).engine.stop_profile)
    return PlainTextResponse(f"Stop profiling. The trace was written to {path}\n")


async def _profiler_call(request: Request, fn: Callable[..., T], *args: object) -> T:
    try:
        return await server_state(request).offload(fn, *args)
    except (ValueError, OSError) as e:  # one already running / none running, a bad spec, an unwritable dir
        raise APIError(400, str(e), getattr(e, "field", None)) from None


def _plain(value: object) -> bool:
    return value is None or isinstance(value, (str, int, float, bool, list, dict))

