"""The load routes a router in front of this server polls (SGLang's router, `sglang-router` / smg).

The router asks `GET /health` before it adds a worker, reads `/server_info` and `/model_info` (older
builds: `/get_server_info`, `/get_model_info`), polls `/v1/loads` (older builds: `/get_load`) for its
load-aware policies, and scrapes `/metrics`. The info routes and `/health_generate` (SGLang's deep health
check) are sglang_api.py's.
"""
from __future__ import annotations

import datetime
from typing import Any

from fastapi import APIRouter, Request

from .state import ServerState, server_state

router = APIRouter()


@router.get("/v1/loads")
async def loads(request: Request) -> dict[str, Any]:
    """SGLang's load report, one entry per data-parallel rank (this server has one)."""
    return {"timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(), "dp_rank_count": 1,
            "loads": [await load_entry(server_state(request))]}


@router.get("/get_load")
async def get_load(request: Request) -> dict[str, Any]:
    """Older routers' load poll: `load` is the requests in flight (running + waiting)."""
    load = await load_entry(server_state(request))
    return {"load": load["num_total_reqs"], **load}


async def load_entry(state: ServerState) -> dict[str, Any]:
    """One data-parallel rank's load, in SGLang's names (this server is one rank)."""
    stats = await state.stats()
    used = int(stats["kv_pool_tokens"] - stats["kv_free_tokens"])
    running, waiting = int(stats["running_requests"]), int(stats["waiting_requests"])
    return {"dp_rank": 0, "num_running_reqs": running, "num_waiting_reqs": waiting,
            "num_total_reqs": running + waiting, "num_used_tokens": used,
            "max_total_num_tokens": int(stats["kv_pool_tokens"]), "token_usage": stats["kv_usage"],
            "gen_throughput": state.throughput.rates()[1], "cache_hit_rate": stats["cache_hit_rate"],
            "utilization": stats["kv_usage"], "max_running_requests": state.engine.config.max_running_requests}
