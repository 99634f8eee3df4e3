"""Anthropic's Messages API: POST /v1/messages (whole or streamed), errors in Anthropic's shape
(server/errors.py).

A request becomes a chat request (server/agent_views.py): `system` a system message, text and image blocks
chat content parts, an assistant's tool_use blocks its tool_calls, a user's tool_result blocks tool messages
(before the rest of that turn), `tool_choice` any/tool/none chat's required/named/none, `stop_sequences`
stop strings. The reply's blocks become thinking, text and tool_use content blocks. `cache_control`
breakpoints become a prompt_cache_key session named by a hash of the prompt up to the last breakpoint,
so the finished sequence stays pinned and the next request sharing that prefix finds it cached
(runtime/kv/pins.py).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from .agent_protocol import CountTokensRequest, MessagesRequest
from .agent_views import (
    Block,
    BlockEvent,
    Ending,
    ProtocolView,
    chat_request,
    named_events,
    supports_thinking_budget,
    thinking_switch,
)
from .errors import APIError, anthropic_error_body
from .openai_api import chat_response
from .openai_params import chat_prompt, check_model, new_id
from .openapi import error_responses, streaming_responses
from .state import server_state
from .tool_calls import plan_tools

router = APIRouter()

# chat field -> the Messages field it came from, for errors
_PARAMS = {"max_completion_tokens": "max_tokens", "stop": "stop_sequences", "tool_choice": "tool_choice",
           "tools": "tools"}
MAX_CACHE_BREAKPOINTS = 4  # Anthropic's limit per request


@router.post("/v1/messages", responses=streaming_responses(400, 404, 413, 503))
async def create_message(body: MessagesRequest, request: Request) -> Response:
    state = server_state(request)
    state.ensure_open()
    check_model(body.model, state.model_name, state.engine.lora_adapters())
    fields = _chat_fields(body, state.engine.tokenizer.chat_template) | {
        "stream": body.stream, "max_completion_tokens": body.max_tokens, "stop": body.stop_sequences,
        "temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k}
    chat = chat_request({k: v for k, v in fields.items() if v is not None}, _PARAMS)
    adapter = MessagesView.adapter(request_body=body, message_id=new_id("msg", "_"))
    return named_events(await chat_response(chat, request, adapter),
                        lambda error: anthropic_error_body(int(error.get("code") or 500), error.get("message", "")))


@router.post("/v1/messages/count_tokens", responses=error_responses(400, 404, 413, 503))
async def count_tokens(body: CountTokensRequest, request: Request) -> dict[str, int]:
    """The prompt's tokens as the chat template renders it (an image counts as its placeholder)."""
    state = server_state(request)
    state.ensure_open()
    check_model(body.model, state.model_name, state.engine.lora_adapters())
    engine = state.engine
    fields = _chat_fields(body, engine.tokenizer.chat_template)
    chat = chat_request({k: v for k, v in fields.items() if v is not None}, _PARAMS)
    # the tool constraint is not compiled: only the prompt is wanted
    plan = await state.offload(plan_tools, chat, engine.tokenizer.chat_template, lambda tag: None)
    prompt, _ = await state.offload(chat_prompt, engine.tokenizer, chat.messages, engine.context_length,
                                    engine.image_prompts, state.model_name, plan)
    return {"input_tokens": len(prompt)}


def _chat_fields(body: CountTokensRequest, chat_template: str | None) -> dict[str, Any]:
    """The chat fields of the request's prompt part: messages, tools, tool choice, thinking, output format."""
    if body.messages[-1].get("role") == "assistant":
        raise APIError(400, "a last assistant message (a prefill to continue) is not supported; end with a user "
                            "message", f"messages[{len(body.messages) - 1}].role")
    breakpoints = _CacheBreakpoints()
    fields: dict[str, Any] = {
        "model": body.model, "messages": _system(body.system, breakpoints) + _messages(body.messages, breakpoints),
        "tools": _tools(body.tools, breakpoints)}
    fields |= _tool_choice(body.tool_choice)
    fields |= _output_format(body)
    fields |= _thinking(body, chat_template)
    fields["prompt_cache_key"] = breakpoints.key(body.cache_control)
    return fields


# ---- the request as chat fields -------------------------------------------------------------------
@dataclass
class _CacheBreakpoints:
    """The prompt's pieces in Anthropic's cache order (tools, system, messages) and where the last
    cache_control breakpoint falls: the session key names that prefix."""

    pieces: list[Any] = field(default_factory=list)
    last: int = 0  # pieces up to the last breakpoint
    count: int = 0
    first_message: int = -1  # where the messages start among the pieces

    def add(self, piece: dict[str, Any], param: str) -> None:
        control = piece.get("cache_control")
        self.pieces.append({k: v for k, v in piece.items() if k != "cache_control"})
        if control is None:
            return
        if not isinstance(control, dict) or control.get("type") != "ephemeral" \
                or control.get("ttl", "5m") not in ("5m", "1h") or set(control) - {"type", "ttl"}:
            raise APIError(400, "cache_control is {'type': 'ephemeral'} (with an optional ttl '5m' or '1h')",
                           f"{param}.cache_control")
        self.count += 1
        if self.count > MAX_CACHE_BREAKPOINTS:
            raise APIError(400, f"at most {MAX_CACHE_BREAKPOINTS} blocks may have cache_control", param)
        self.last = len(self.pieces)

    def key(self, automatic: dict[str, Any] | None) -> str | None:
        """The session key: the prefix up to the last breakpoint; with the request's top-level (automatic)
        cache_control, the conversation's start (tools, system, first message), so each turn moves one pin
        forward to the newest sequence, which holds every earlier turn."""
        if automatic is not None:
            self.add({"cache_control": automatic}, "cache_control")
            self.last = min(len(self.pieces), self.first_message + 2)  # its role and first block
        if not self.count:
            return None
        prefix = json.dumps(self.pieces[:self.last], sort_keys=True, ensure_ascii=False)
        return "anthropic-cache:" + hashlib.sha256(prefix.encode("utf-8", "surrogatepass")).hexdigest()


def _system(system: str | list[dict[str, Any]] | None, breakpoints: _CacheBreakpoints) -> list[dict[str, Any]]:
    if system is None:
        return []
    if isinstance(system, str):
        breakpoints.add({"system": system}, "system")
        return [{"role": "system", "content": system}]
    texts = []
    for i, block in enumerate(system):
        if block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise APIError(400, "system blocks are {'type': 'text', 'text': ...}", f"system[{i}]")
        breakpoints.add(block, f"system[{i}]")
        texts.append(block["text"])
    return [{"role": "system", "content": "\n".join(texts)}]


def _messages(messages: list[dict[str, Any]], breakpoints: _CacheBreakpoints) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        param = f"messages[{i}]"
        role, content = m.get("role"), m.get("content")
        if role not in ("user", "assistant"):
            raise APIError(400, f"a message's role is 'user' or 'assistant', got {role!r}", f"{param}.role")
        if i == 0:
            breakpoints.first_message = len(breakpoints.pieces)
        breakpoints.add({"role": role}, param)
        if isinstance(content, str):
            breakpoints.add({"text": content}, param)
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise APIError(400, "content is a string or a list of content blocks", f"{param}.content")
        parts: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        for j, block in enumerate(content):
            bparam = f"{param}.content[{j}]"
            if not isinstance(block, dict):
                raise APIError(400, "a content block is an object with a type", bparam)
            breakpoints.add(block, bparam)
            kind = block.get("type")
            if kind == "text" and isinstance(block.get("text"), str):
                parts.append({"type": "text", "text": block["text"]})
            elif kind == "image" and role == "user":
                parts.append({"type": "image_url", "image_url": {"url": _image_url(block, bparam)}})
            elif kind == "tool_use" and role == "assistant":
                calls.append(_history_call(block, bparam))
            elif kind == "tool_result" and role == "user":
                out.append({"role": "tool", "tool_call_id": _string(block, "tool_use_id", bparam),
                            "content": _result_text(block, bparam)})
            elif kind in ("thinking", "redacted_thinking") and role == "assistant":
                continue  # past reasoning: chat templates drop it too
            else:
                allowed = "text, image and tool_result" if role == "user" else "text, tool_use and thinking"
                raise APIError(400, f"a {role} message takes content blocks of type {allowed}, got {kind!r}", bparam)
        if role == "assistant":
            out.append({"role": "assistant", "content": parts or (None if calls else ""),
                        **({"tool_calls": calls} if calls else {})})
        elif parts or not out or out[-1]["role"] != "tool":
            out.append({"role": "user", "content": parts})
    return out


def _string(block: dict[str, Any], name: str, param: str) -> str:
    value = block.get(name)
    if not isinstance(value, str) or not value:
        raise APIError(400, f"{name} must be a non-empty string", f"{param}.{name}")
    return value


def _image_url(block: dict[str, Any], param: str) -> str:
    source = block.get("source")
    if not isinstance(source, dict) or source.get("type") != "base64" or not isinstance(source.get("data"), str) \
            or not isinstance(source.get("media_type"), str):
        raise APIError(400, "an image block's source is {'type': 'base64', 'media_type': 'image/png', 'data': ...}",
                       f"{param}.source")
    return f"data:{source['media_type']};base64,{source['data']}"


def _history_call(block: dict[str, Any], param: str) -> dict[str, Any]:
    arguments = block.get("input", {})
    if not isinstance(arguments, dict):
        raise APIError(400, "a tool_use block's input is an object", f"{param}.input")
    return {"id": _string(block, "id", param), "type": "function",
            "function": {"name": _string(block, "name", param), "arguments": json.dumps(arguments, ensure_ascii=False)}}


def _result_text(block: dict[str, Any], param: str) -> str:
    content = block.get("content", "")
    if isinstance(content, list):
        if not all(isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str) for b in content):
            raise APIError(400, "a tool_result's content is a string or text blocks", f"{param}.content")
        content = "\n".join(b["text"] for b in content)
    if not isinstance(content, str):
        raise APIError(400, "a tool_result's content is a string or text blocks", f"{param}.content")
    return f"Error: {content}" if block.get("is_error") else content


def _tools(tools: list[dict[str, Any]] | None, breakpoints: _CacheBreakpoints) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") not in (None, "custom"):
            raise APIError(400, f"only client tools (name, description, input_schema) are supported, got type "
                                f"{tool.get('type')!r}", f"tools[{i}].type")
        breakpoints.add(tool, f"tools[{i}]")
        fn = {"name": tool.get("name"), "description": tool.get("description", "")}
        if tool.get("input_schema") is not None:
            fn["parameters"] = tool["input_schema"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: dict[str, Any] | None) -> dict[str, Any]:
    if choice is None:
        return {}
    kind = choice.get("type")
    named = {"type": "function", "function": {"name": choice.get("name")}}
    chat = {"auto": "auto", "any": "required", "none": "none", "tool": named}.get(kind)  # type: ignore[arg-type]
    if chat is None or (kind == "tool" and not isinstance(choice.get("name"), str)):
        raise APIError(400, "tool_choice is {'type': 'auto' | 'any' | 'none'} or {'type': 'tool', 'name': ...}",
                       "tool_choice")
    parallel = {"parallel_tool_calls": False} if choice.get("disable_parallel_tool_use") else {}
    return {"tool_choice": chat, **parallel}


def _output_format(body: CountTokensRequest) -> dict[str, Any]:
    fmt = body.output_config.format if body.output_config is not None else None
    if fmt is None:
        return {}
    if fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise APIError(400, "output_config.format is {'type': 'json_schema', 'schema': {...}}", "output_config.format")
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}}


def _thinking(body: CountTokensRequest, chat_template: str | None) -> dict[str, Any]:
    """`thinking` as the template's switch and, where the chat route takes it, a thinking token budget."""
    thinking = body.thinking
    if thinking is None:
        return {}
    if thinking.type == "disabled":
        return thinking_switch(chat_template, False)
    fields = thinking_switch(chat_template, True)
    if thinking.type == "enabled":
        budget = thinking.budget_tokens
        max_tokens = body.max_tokens if isinstance(body, MessagesRequest) else None
        if budget is None or (max_tokens is not None and budget >= max_tokens):
            raise APIError(400, "thinking.budget_tokens is required with type 'enabled' and must be less than "
                                "max_tokens", "thinking.budget_tokens")
        if supports_thinking_budget():
            fields["thinking_token_budget"] = budget
    return fields


# ---- the reply as a message -----------------------------------------------------------------------
@dataclass
class MessagesView(ProtocolView):
    request_body: MessagesRequest = field(kw_only=True)
    message_id: str = field(kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.job.id = self.message_id  # the engine's rid: /abort takes the message id

    def whole_body(self, blocks: list[Block], ending: Ending) -> dict[str, Any]:
        stop_reason, stop_sequence = _stop_reason(ending)
        return self._message([self._block(b, True) for b in blocks], stop_reason, stop_sequence, self._usage(ending))

    def opening(self) -> list[dict[str, Any]]:
        usage = {"input_tokens": len(self.job.prompts[0]), "output_tokens": 0, "cache_read_input_tokens": 0,
                 "cache_creation_input_tokens": 0}
        return [{"type": "message_start", "message": self._message([], None, None, usage)}]

    def on_block(self, event: BlockEvent) -> list[dict[str, Any]]:
        i, block = event.index, event.block
        if event.action == "open":
            return [{"type": "content_block_start", "index": i, "content_block": self._block(block, False)}]
        if event.action == "close":
            return [{"type": "content_block_stop", "index": i}]
        delta = {"text": {"type": "text_delta", "text": event.piece},
                 "reasoning": {"type": "thinking_delta", "thinking": event.piece},
                 "call": {"type": "input_json_delta", "partial_json": event.piece}}[block.kind]
        return [{"type": "content_block_delta", "index": i, "delta": delta}]

    def closing(self, ending: Ending) -> list[dict[str, Any]]:
        stop_reason, stop_sequence = _stop_reason(ending)
        return [{"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                 "usage": self._usage(ending)},
                {"type": "message_stop"}]

    def _message(self, content: list[dict[str, Any]], stop_reason: str | None, stop_sequence: str | None,
                 usage: dict[str, int]) -> dict[str, Any]:
        return {"id": self.message_id, "type": "message", "role": "assistant", "model": self.request_body.model,
                "content": content, "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": usage}

    @staticmethod
    def _usage(ending: Ending) -> dict[str, int]:
        """Anthropic counts cached prompt tokens apart: input_tokens are the ones computed."""
        return {"input_tokens": ending.prompt_tokens - ending.cached_tokens, "output_tokens": ending.completion_tokens,
                "cache_read_input_tokens": ending.cached_tokens, "cache_creation_input_tokens": 0}

    @staticmethod
    def _block(block: Block, done: bool) -> dict[str, Any]:
        if block.kind == "reasoning":
            return {"type": "thinking", "thinking": block.text if done else "", "signature": ""}
        if block.kind == "call":
            return {"type": "tool_use", "id": block.call_id, "name": block.name,
                    "input": json.loads(block.text or "{}") if done else {}}
        return {"type": "text", "text": block.text if done else ""}


def _stop_reason(ending: Ending) -> tuple[str, str | None]:
    if ending.finish_reason == "tool_calls":
        return "tool_use", None
    if ending.finish_reason == "length":
        return "max_tokens", None
    if isinstance(ending.matched_stop, str):
        return "stop_sequence", ending.matched_stop
    return "end_turn", None
