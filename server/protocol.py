"""Request bodies of the HTTP API: SGLang's native /generate and the OpenAI-compatible routes.

Strict models: a wrong type is an error rather than a silent coercion, and unknown fields are
rejected, so a misspelled option never goes unnoticed.
"""
from __future__ import annotations

import typing
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from ..runtime.sampling_params import RULES, SamplingParams

# the engine's sampling fields OpenAI spells otherwise (the others keep the engine's name)
OPENAI_NAMES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens", "json_schema": "response_format",
                "structural_tag": "response_format"}


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


# ---- fields SGLang defines that a router adds when it forwards (see server/sglang_fields.py) --------
class SGLangGenerateExtras(StrictModel):
    """SGLang's /generate fields beyond the ones radixlang implements. SGLang's router (smg) sends
    several on every request it forwards. Accepted; those that ask for a feature radixlang lacks must
    keep their default (UNSUPPORTED in sglang_fields.py), the rest are ignored (docs/scale-out.md, "What the
    router calls on a worker"), except `priority`, which the scheduler uses (runtime/scheduling/schedule_policy.py)."""

    model: str | None = None
    log_metrics: bool = True
    no_logs: bool = False
    priority: int | None = None
    custom_labels: dict[str, str] | None = None
    conversation_id: str | None = None
    extra_key: str | None = None
    modalities: list[str] | None = None
    data_parallel_rank: int | None = None
    return_hidden_states: bool = False
    return_entropy: bool = False
    return_bytes: bool = False
    background: bool = False
    token_ids_logprob: list[int] | None = None
    input_embeds: Any = None
    video_data: Any = None
    audio_data: Any = None
    session_params: dict[str, Any] | None = None
    lora_path: str | list[str | None] | None = None  # a loaded adapter's name (SGLang's), or one per prompt
    lora_id: Any = None
    custom_logit_processor: Any = None
    bootstrap_host: Any = None
    bootstrap_port: Any = None
    bootstrap_room: Any = None
    bootstrap_pair_key: Any = None


class SGLangChatExtras(StrictModel):
    """SGLang's (and newer OpenAI) chat fields beyond the ones radixlang implements; as SGLangGenerateExtras."""

    continue_final_message: bool = False
    separate_reasoning: bool = True
    stream_reasoning: bool = True
    return_hidden_states: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    verbosity: Any = None
    modalities: list[str] | None = None
    return_audio: bool | None = None
    priority: int | None = None
    rid: str | None = None
    lora_path: str | None = None  # a loaded adapter's name (SGLang's); `model` may name it too
    session_params: dict[str, Any] | None = None
    bootstrap_host: Any = None
    bootstrap_port: Any = None
    bootstrap_room: Any = None


class SGLangCompletionExtras(StrictModel):
    """SGLang's /v1/completions fields beyond the ones radixlang implements; as SGLangGenerateExtras."""

    return_hidden_states: bool = False
    priority: int | None = None
    lora_path: str | None = None  # a loaded adapter's name (SGLang's); `model` may name it too
    session_params: dict[str, Any] | None = None


# ---- native (SGLang) ------------------------------------------------------------------------------
class GenerateRequest(SGLangGenerateExtras):
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    # a vision model's images as base64 data URLs: one prompt's (one, or a list), or a list per prompt
    image_data: str | list[str] | list[list[str]] | None = None
    sampling_params: dict[str, Any] | None = None  # validated by the engine (SamplingParams)
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    stream: bool = False
    rid: str | list[str] | None = None
    # a session: once the request finishes, its whole sequence stays cached for the server's
    # prompt_cache_retention (OpenAI's prompt_cache_key; `session` is the same, spelled natively)
    session: str | None = Field(None, min_length=1, max_length=256)
    prompt_cache_key: str | None = Field(None, min_length=1, max_length=256)
    # the reply's thinking as `reasoning_text`, `text` keeping the answer (the server's reasoning parser, or
    # sampling_params.reasoning_parser); SGLang's chat field, with its /separate_reasoning route's names
    separate_reasoning: bool = False

    @model_validator(mode="after")
    def _one_prompt_kind(self) -> "GenerateRequest":
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("pass exactly one of text and input_ids")
        if self.session is not None and self.prompt_cache_key is not None:
            raise ValueError("pass at most one of session and prompt_cache_key")
        return self

    @property
    def cache_key(self) -> str | None:
        return self.session if self.session is not None else self.prompt_cache_key


class SeparateReasoningRequest(StrictModel):  # SGLang's /separate_reasoning
    text: str
    reasoning_parser: str | None = None  # default: the server's


class ConcatenateRequest(StrictModel):  # SGLang's /concate_and_append_request (a fork join)
    src_rids: list[str]
    dst_rid: str


class LoadLoraRequest(StrictModel):
    """SGLang's /load_lora_adapter body: serve the PEFT folder `lora_path` (on the server's disk) as `lora_name`."""

    lora_name: str = Field(min_length=1, max_length=256)
    lora_path: str = Field(min_length=1)
    pinned: bool = False  # SGLang's: keep the adapter in a device slot; every slot here is reloaded when needed


class UnloadLoraRequest(StrictModel):
    lora_name: str = Field(min_length=1, max_length=256)


class ProfileRequest(StrictModel):
    """SGLang's /start_profile body (its ProfileReq); every field optional. profile_by_stage, start_step,
    profile_stages and detailed_annotations ask for what radixlang's profiler lacks: 400 unless left off;
    merge_profiles holds already (one rank, one trace)."""

    output_dir: str | None = None
    num_steps: int | None = Field(default=None, ge=1)  # default=: type checkers read only the keyword
    activities: list[str] | None = None
    with_stack: bool | None = None
    record_shapes: bool | None = None
    profile_id: str | None = None
    profile_prefix: str | None = None
    merge_profiles: bool = False
    start_step: int | None = None
    profile_by_stage: bool = False
    profile_stages: list[str] | None = None
    detailed_annotations: bool = False


class TokenizeRequest(StrictModel):  # vLLM's /tokenize
    prompt: str
    add_special_tokens: bool = True


class DetokenizeRequest(StrictModel):  # vLLM's /detokenize
    tokens: list[int]


class ProgramRequest(StrictModel):
    program: dict[str, Any]  # a traced program's IR (ProgramIR.to_dict()); validated by lang
    args: dict[str, Any] = Field(default_factory=dict)
    sampling_params: dict[str, Any] | None = None  # run()'s sampling defaults
    stream: bool = False


class ReleaseCacheRequest(StrictModel):
    """POST /v1/prompt_cache/release: drops a session's pinned prefix before its retention runs out."""

    prompt_cache_key: str = Field(min_length=1, max_length=256)


class AbortRequest(StrictModel):
    rid: str | None = None
    abort_all: bool = False

    @model_validator(mode="after")
    def _one_target(self) -> "AbortRequest":
        if (self.rid is None) == (not self.abort_all):
            raise ValueError("pass either rid or abort_all=true")
        return self


class UpdateWeightsFromDiskRequest(StrictModel):
    """SGLang's /update_weights_from_disk body (its fields radixlang acts on; flush_cache can only be true: KV of
    the old weights is never reused)."""

    model_path: str
    load_format: Literal["auto", "safetensors", "gguf"] | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None
    flush_cache: Literal[True] = True


class UpdateWeightsFromTensorRequest(StrictModel):
    """SGLang's /update_weights_from_tensor body. SGLang's clients send each rank's tensors pickled; radixlang
    never unpickles what the network sends: each item is a safetensors file, base64 (load_format "safetensors",
    the default), whole HF tensors (the engine shards them). One item, or one per tensor-parallel rank as
    SGLang's clients send: then they must be the same."""

    serialized_named_tensors: list[str] = Field(min_length=1)
    load_format: Literal["safetensors"] | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None
    flush_cache: Literal[True] = True


class PauseGenerationRequest(StrictModel):
    mode: Literal["in_place", "abort"] = "in_place"  # SGLang's modes: requests kept as they are, or aborted


# ---- OpenAI ---------------------------------------------------------------------------------------
class StreamOptions(StrictModel):
    include_usage: bool = False


class JsonSchemaFormat(StrictModel):
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(StrictModel):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    # structural_tag, as SGLang and vLLM take it: structures + triggers, or XGrammar's `format`
    structures: list[dict[str, Any]] | None = None
    triggers: list[str] | None = None
    format: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _schema_when_needed(self) -> "ResponseFormat":
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema is required with type 'json_schema' and allowed only with it")
        tagged = any(x is not None for x in (self.structures, self.triggers, self.format))
        if tagged != (self.type == "structural_tag"):
            raise ValueError("structural_tag needs structures and triggers, or format; they go only with it")
        return self


class _OpenAIFields(StrictModel):
    """What both OpenAI routes share besides the engine's sampling fields."""

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None
    # OpenAI's: requests sharing it are one session, whose finished sequence the server keeps cached
    prompt_cache_key: str | None = Field(None, min_length=1, max_length=256)


def _sampling_fields() -> dict[str, Any]:
    """The engine's sampling fields as OpenAI spells them (SGLang's and vLLM's names for extensions),
    each optional: unset, the engine's default applies. json_schema (and its strict flag) and structural_tag
    come as response_format."""
    hints = typing.get_type_hints(SamplingParams)
    return {OPENAI_NAMES.get(name, name): ((rule.accepts or hints[name]) | None, None)
            for name, rule in RULES.items() if name not in ("json_schema", "json_schema_strict", "structural_tag")}


if typing.TYPE_CHECKING:
    class SamplingFields(_OpenAIFields):
        """What create_model builds below, declared for the type checker (`_sampling_fields` is the source)."""

        max_tokens: int | None = None
        min_tokens: int | None = None
        temperature: float | None = None
        top_p: float | None = None
        top_k: int | None = None
        min_p: float | None = None
        frequency_penalty: float | None = None
        presence_penalty: float | None = None
        repetition_penalty: float | None = None
        stop: str | list[str] | None = None
        stop_token_ids: list[int] | None = None
        ignore_eos: bool | None = None
        skip_special_tokens: bool | None = None
        no_stop_trim: bool | None = None
        n: int | None = None
        seed: int | None = None
        regex: str | None = None
        grammar: str | None = None
        stop_regex: str | list[str] | None = None
        logit_bias: dict[str, float] | None = None
        spaces_between_special_tokens: bool | None = None
        stream_interval: int | None = None
        custom_params: dict[str, Any] | None = None
        beam_width: int | None = None
        ebnf: str | None = None
        watermark: Any | None = None
        reasoning_parser: str | None = None
        thinking_token_budget: int | None = None
else:
    SamplingFields = create_model("SamplingFields", __base__=_OpenAIFields, **_sampling_fields())


class CompletionRequest(SamplingFields, SGLangCompletionExtras):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None


class ChatMessage(StrictModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's calls (checked by server/tool_calls)
    tool_call_id: str | None = None  # a tool result: the call it answers
    # an assistant turn's thinking, as SGLang's and vLLM's chat routes take it back in the history: the chat
    # template renders it (Qwen3's reads reasoning_content; runtime/tokenizer.py also gives it the other names)
    reasoning_content: str | None = None
    reasoning: str | None = None


class ChatCompletionRequest(SamplingFields, SGLangChatExtras):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None  # checked by server/tool_calls, naming the field
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
