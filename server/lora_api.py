"""SGLang's LoRA admin routes: POST /load_lora_adapter {lora_name, lora_path} and /unload_lora_adapter
{lora_name} (admin key only, server/auth.py). Requests name an adapter by /generate's `lora_path` or OpenAI's
`model` (server/openai_params.py); docs/lora.md."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from ..runtime.lora import UnknownAdapter
from .errors import APIError
from .openapi import error_responses
from .protocol import LoadLoraRequest, UnloadLoraRequest
from .state import server_state

router = APIRouter()


@router.post("/load_lora_adapter", responses=error_responses(400, 422))
async def load_lora_adapter(body: LoadLoraRequest, request: Request) -> dict[str, Any]:
    """Serves the PEFT folder `lora_path` as `lora_name`; a 400 names what does not fit (the folder, the rank,
    the model's shapes, a feature LoRA serving lacks)."""
    engine = server_state(request).engine
    try:
        await server_state(request).offload(engine.load_lora_adapter, body.lora_name, body.lora_path)
    except (ValueError, OSError) as e:
        raise APIError(400, str(e), "lora_path") from None
    return _result(engine.lora_adapters())


@router.post("/unload_lora_adapter", responses=error_responses(400, 404, 422))
async def unload_lora_adapter(body: UnloadLoraRequest, request: Request) -> dict[str, Any]:
    """Stops serving `lora_name`: new requests get a 404 at once; its running requests finish first."""
    engine = server_state(request).engine
    try:
        await server_state(request).offload(engine.unload_lora_adapter, body.lora_name)
    except UnknownAdapter as e:
        raise APIError(404, str(e), "lora_name", kind="not_found_error") from None
    except ValueError as e:
        raise APIError(400, str(e), "lora_name") from None
    return _result(engine.lora_adapters())


def _result(adapters: dict[str, str]) -> dict[str, Any]:
    """SGLang's reply shape (LoadLoRAAdapterReqOutput)."""
    return {"success": True, "error_message": "", "loaded_adapters": adapters}
