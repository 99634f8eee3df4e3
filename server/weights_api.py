"""SGLang's live weight routes, as RL frameworks (verl, slime, OpenRLHF) call them on a rollout server:
/update_weights_from_disk, /pause_generation, /continue_generation (admin routes: server/auth.py).

An update that cannot apply (another architecture or shape, a missing path) is a 400 with SGLang's
{"success": false, "message"} beside our error body, and the server goes on serving the old weights.
"""
from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse

from .errors import error_body
from .openapi import error_responses
from .protocol import PauseGenerationRequest, UpdateWeightsFromDiskRequest
from .state import server_state

router = APIRouter()


@router.post("/update_weights_from_disk", responses=error_responses(400, 422))
async def update_weights_from_disk(body: UpdateWeightsFromDiskRequest, request: Request) -> JSONResponse:
    """Serves another checkpoint's weights (same architecture and shapes); requests in flight finish on the old
    weights first, or are aborted with abort_all_requests; no KV of the old weights is reused after."""
    engine = server_state(request).engine
    try:
        result = await asyncio.to_thread(engine.update_weights_from_disk, body.model_path, body.load_format,
                                         body.abort_all_requests, body.weight_version)
    except (ValueError, TypeError) as e:
        return JSONResponse({"success": False, "message": str(e)} | error_body(400, str(e)), status_code=400)
    return JSONResponse({"success": True, "message": result.message, "weight_version": result.weight_version,
                         "num_aborted_requests": result.aborted})


@router.post("/pause_generation", responses=error_responses(422))
async def pause_generation(request: Request, body: PauseGenerationRequest | None = Body(None)) -> dict[str, Any]:
    """No step runs until /continue_generation: requests stay queued or running (mode "abort": aborted)."""
    mode = (body or PauseGenerationRequest()).mode
    aborted = await asyncio.to_thread(server_state(request).engine.pause_generation, mode)
    return {"success": True, "message": f"generation paused ({mode})", "num_aborted_requests": aborted}


@router.post("/continue_generation")
async def continue_generation(request: Request) -> dict[str, Any]:
    await asyncio.to_thread(server_state(request).engine.continue_generation)
    return {"success": True, "message": "generation continued"}
