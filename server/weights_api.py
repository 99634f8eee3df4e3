"""SGLang's live weight routes, as RL frameworks (verl, slime, OpenRLHF) call them on a rollout server:
/update_weights_from_disk, /update_weights_from_tensor, /pause_generation, /continue_generation (admin routes:
server/auth.py).

An update that cannot apply (another architecture or shape, a missing path) is a 400 with SGLang's
{"success": false, "message"} beside our error body, and the server goes on serving the old weights.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
from typing import Any

import torch
from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors

from .errors import error_body
from .openapi import error_responses
from .protocol import PauseGenerationRequest, UpdateWeightsFromDiskRequest, UpdateWeightsFromTensorRequest
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


@router.post("/update_weights_from_tensor", responses=error_responses(400, 422))
async def update_weights_from_tensor(body: UpdateWeightsFromTensorRequest, request: Request) -> JSONResponse:
    """Copies HF-named tensors into the model (only those change), sent as a base64 safetensors file; a bad file,
    an unknown name or a wrong shape is a 400 naming it, with the old weights serving on."""
    engine = server_state(request).engine
    try:
        named = _named_tensors(body.serialized_named_tensors)
        result = await asyncio.to_thread(engine.update_weights_from_tensor, named, body.weight_version,
                                         body.abort_all_requests)
    except (ValueError, TypeError) as e:
        return JSONResponse({"success": False, "message": str(e)} | error_body(400, str(e)), status_code=400)
    return JSONResponse({"success": True, "message": result.message, "weight_version": result.weight_version,
                         "num_aborted_requests": result.aborted})


def _named_tensors(items: list[str]) -> list[tuple[str, torch.Tensor]]:
    """The tensors of the first base64 safetensors file (the others, one per SGLang rank, must be the same)."""
    if any(item != items[0] for item in items[1:]):
        raise ValueError("serialized_named_tensors: radixlang shards whole tensors itself; the items (one per "
                         "tensor-parallel rank) must be the same file")
    try:
        data = base64.b64decode(items[0], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("serialized_named_tensors[0] is not base64 (a safetensors file, base64-encoded)") from None
    try:
        tensors = load_safetensors(data)
    except (SafetensorError, ValueError) as e:
        raise ValueError(f"serialized_named_tensors[0] is not a safetensors file: {e}") from None
    if not tensors:
        raise ValueError("serialized_named_tensors[0] holds no tensors")
    return list(tensors.items())


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
