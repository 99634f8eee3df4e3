"""SGLang's request fields that radixlang accepts without implementing (protocol.SGLangGenerateExtras,
SGLangChatExtras): SGLang's router adds them to every request it forwards, so refusing them would refuse
the router. A field that asks for a feature radixlang lacks is refused with a 400 naming it unless it keeps
its default; the others are ignored (docs/scale-out.md's fields table says why for each)."""
from __future__ import annotations

from pydantic import BaseModel

from .errors import APIError
from .protocol import SGLangGenerateExtras

# field -> the only value accepted (its default): what a value other than it would ask for
_GENERATE_UNSUPPORTED: dict[str, tuple[bool | None, str]] = {
    "return_hidden_states": (False, "hidden states"),
    "return_entropy": (False, "per-token entropy"),
    "return_bytes": (False, "output bytes"),
    "background": (False, "background requests"),
    "token_ids_logprob": (None, "logprobs of chosen token ids"),
    "input_embeds": (None, "input embeddings"),
    "video_data": (None, "video input"),
    "audio_data": (None, "audio input"),
    "session_params": (None, "sessions"),
    "lora_id": (None, "LoRA adapter ids (name the adapter in lora_path)"),
    "custom_logit_processor": (None, "custom logit processors"),
    "bootstrap_host": (None, "prefill/decode disaggregation"),
    "bootstrap_port": (None, "prefill/decode disaggregation"),
    "bootstrap_room": (None, "prefill/decode disaggregation"),
    "bootstrap_pair_key": (None, "prefill/decode disaggregation"),
}
_CHAT_UNSUPPORTED: dict[str, tuple[bool | None, str]] = {
    "continue_final_message": (False, "continuing the last assistant message"),
    "return_hidden_states": (False, "hidden states"),
    "return_audio": (None, "audio output"),
    "session_params": (None, "sessions"),
    "bootstrap_host": (None, "prefill/decode disaggregation"),
    "bootstrap_port": (None, "prefill/decode disaggregation"),
    "bootstrap_room": (None, "prefill/decode disaggregation"),
}

_PROFILE_UNSUPPORTED: dict[str, tuple[bool | None, str]] = {
    "start_step": (None, "starting at a later step (start it then)"),
    "profile_by_stage": (False, "separate prefill / decode traces"),
    "profile_stages": (None, "profiling some stages only"),
    "detailed_annotations": (False, "per-step KV annotations"),
}

_COMPLETION_UNSUPPORTED = {name: _CHAT_UNSUPPORTED[name] for name in ("return_hidden_states", "session_params")}


def check_generate_extras(body: SGLangGenerateExtras) -> None:
    """A 400 naming the first SGLang field of a /generate body that asks for what radixlang lacks."""
    _refuse(body, _GENERATE_UNSUPPORTED)
    rank = body.data_parallel_rank
    if rank not in (None, 0):  # a worker is one rank: a router's dp_aware mode must not address others
        raise APIError(400, f"data_parallel_rank must be 0 or null: this server is one rank, got {rank}",
                       "data_parallel_rank")


def check_chat_extras(body: BaseModel) -> None:
    """As check_generate_extras, for /v1/chat/completions."""
    _refuse(body, _CHAT_UNSUPPORTED)


def check_completion_extras(body: BaseModel) -> None:
    """As check_generate_extras, for /v1/completions."""
    _refuse(body, _COMPLETION_UNSUPPORTED)


def check_profile_extras(body: BaseModel) -> None:
    """As check_generate_extras, for /start_profile."""
    _refuse(body, _PROFILE_UNSUPPORTED)


def _refuse(body: BaseModel, unsupported: dict[str, tuple[bool | None, str]]) -> None:
    for name, (default, feature) in unsupported.items():
        value = getattr(body, name)
        if value != default and not (default is None and value in ([], {})):
            raise APIError(400, f"{name}: radixlang does not support {feature}; leave it {_json(default)}", name)


def _json(value: bool | None) -> str:
    return {None: "null", False: "false"}.get(value, repr(value))
