"""The routes a router in front of this server calls (SGLang's router, `sglang-router` / smg): worker info,
load, and a health check that runs the model.

The router asks `GET /health` before it adds a worker, reads `/server_info` and `/model_info` (older
builds: `/get_server_info`, `/get_model_info`), polls `/v1/loads` (older builds: `/get_load`) for its
load-aware policies, and scrapes `/metrics`. `/health_generate` is SGLang's deep health check: it
generates one token, so a scheduler that is alive but cannot run the model fails it.
"""
from __future__ import annotations

import asyncio
import datetime
import os
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ..runtime.sampling_params import SamplingParams
from .config import HEALTH_TIMEOUT_S
from .openapi import error_responses
from .programs import model_info
from .state import ServerState, server_state

router = APIRouter()
HEALTH_PROMPT = [0]  # one token id: the check prefills it and decodes one token


@router.get("/get_server_info")
@router.get("/server_info")
async def server_info(request: Request) -> dict[str, Any]:
    """SGLang's server arguments, as far as the router reads them (model, ports, parallelism), plus the
    engine's settings and live load."""
    state = server_state(request)
    config = state.engine.config
    return {"model_path": config.model, "tokenizer_path": config.model, "served_model_name": state.model_name,
            "host": request.url.hostname, "port": request.url.port, "tp_size": config.tp_size, "dp_size": 1,
            "context_length": state.engine.context_length, "max_total_num_tokens": state.engine.pool_size,
            "max_running_requests": config.max_running_requests, "is_embedding": False,
            "engine_config": {k: getattr(config, k) for k in config.__slots__},
            "version": _version(), "pid": os.getpid(), "internal_states": [await _load(state)]}


# the router reads /model_info; the handler is /get_model_info's
router.add_api_route("/model_info", model_info, methods=["GET"])


@router.get("/health_generate", responses=error_responses(503))
async def health_generate(request: Request) -> JSONResponse:
    """Healthy once the engine has generated a token within the health timeout."""
    state = server_state(request)
    if state.draining:
        return JSONResponse({"status": "shutting down"}, status_code=503)
    params = SamplingParams(max_new_tokens=1, temperature=0.0)
    try:
        await asyncio.wait_for(state.engine.async_generate(input_ids=[HEALTH_PROMPT], sampling_params=params),
                               HEALTH_TIMEOUT_S)
    except (asyncio.TimeoutError, RuntimeError) as e:
        return JSONResponse({"status": f"engine cannot generate: {e!r}"}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/v1/loads")
async def loads(request: Request) -> dict[str, Any]:
    """SGLang's load report, one entry per data-parallel rank (this server has one)."""
    return {"timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(), "dp_rank_count": 1,
            "loads": [await _load(server_state(request))]}


@router.get("/get_load")
async def get_load(request: Request) -> dict[str, Any]:
    """Older routers' load poll: `load` is the requests in flight (running + waiting)."""
    load = await _load(server_state(request))
    return {"load": load["num_total_reqs"], **load}


async def _load(state: ServerState) -> dict[str, Any]:
    stats = await state.stats()
    used = int(stats["kv_pool_tokens"] - stats["kv_free_tokens"])
    running, waiting = int(stats["running_requests"]), int(stats["waiting_requests"])
    return {"dp_rank": 0, "num_running_reqs": running, "num_waiting_reqs": waiting,
            "num_total_reqs": running + waiting, "num_used_tokens": used,
            "max_total_num_tokens": int(stats["kv_pool_tokens"]), "token_usage": stats["kv_usage"],
            "gen_throughput": state.throughput.rates()[1], "cache_hit_rate": stats["cache_hit_rate"],
            "utilization": stats["kv_usage"], "max_running_requests": state.engine.config.max_running_requests}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("radixlang")
    except PackageNotFoundError:
        return "unknown"
