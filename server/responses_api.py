"""OpenAI's Responses API: POST /v1/responses (whole or streamed), GET and DELETE /v1/responses/{id}.

A request becomes a chat request (server/agent_views.py): `instructions` a system message, `input` items
chat messages (function_call items an assistant's tool_calls, function_call_output items tool messages),
`text.format` a response_format, `max_output_tokens` max_completion_tokens. The reply's blocks become
output items: `reasoning`, `message` (output_text) and `function_call`. With store (the default) the
response is kept (server/response_store.py) and its KV pinned under a session named by its id, so a
`previous_response_id` follow-up continues the conversation from the cache.
"""
from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from .agent_protocol import ResponsesRequest
from .agent_views import Block, BlockEvent, Ending, ProtocolView, chat_request, named_events, thinking_switch
from .auth import Tenant, tenant_of
from .errors import APIError
from .openai_api import chat_response
from .openai_params import check_model, new_id
from .openapi import error_responses, streaming_responses
from .response_store import ResponseStore, StoredResponse
from .state import server_state

router = APIRouter()

# chat field -> the Responses field it came from, for errors
_PARAMS = {"messages": "input", "max_completion_tokens": "max_output_tokens", "response_format": "text.format",
           "tool_choice": "tool_choice", "tools": "tools"}


@dataclass
class TenantResponses:
    """The stored responses as one tenant sees them: ids are scoped to the tenant (as prompt_cache_keys are), so
    another tenant's response id is not found, cannot be continued, read or deleted."""
    store: ResponseStore
    tenant: Tenant

    def get(self, response_id: str) -> StoredResponse | None:
        return self.store.get(self.tenant.scoped(response_id))

    def put(self, response_id: str, body: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        self.store.put(self.tenant.scoped(response_id), body, messages)

    def delete(self, response_id: str) -> bool:
        return self.store.delete(self.tenant.scoped(response_id))


def response_store(request: Request) -> TenantResponses:
    return TenantResponses(request.app.state.responses, tenant_of(request))


@router.post("/v1/responses", responses=streaming_responses(400, 404, 413, 503))
async def create_response(body: ResponsesRequest, request: Request) -> Response:
    state = server_state(request)
    state.ensure_open()
    check_model(body.model, state.model_name, state.engine.lora_adapters())
    store = response_store(request)
    history: list[dict[str, Any]] = []
    if body.previous_response_id is not None:
        previous = store.get(body.previous_response_id)
        if previous is None:
            raise APIError(400, f"previous response {body.previous_response_id!r} is not stored here (never stored, "
                                "deleted, or expired)", "previous_response_id")
        history = previous.messages
    response_id = new_id("resp", "_")
    origins: list[str] = []  # the field each new chat message came from
    conversation = history + input_messages(body.input, origins)
    instructions = [{"role": "system", "content": body.instructions}] if body.instructions is not None else []
    origins = ["instructions"] * len(instructions) + ["previous_response_id"] * len(history) + origins
    fields: dict[str, Any] = {
        "model": body.model, "messages": instructions + conversation, "stream": body.stream,
        "max_completion_tokens": body.max_output_tokens, "temperature": body.temperature, "top_p": body.top_p,
        "tools": _tools(body.tools), "tool_choice": _tool_choice(body.tool_choice),
        "parallel_tool_calls": body.parallel_tool_calls, "response_format": _response_format(body),
        "thinking_token_budget": body.thinking_token_budget,
        # the finished sequence stays pinned, so a follow-up's prompt is a cache hit
        "prompt_cache_key": body.prompt_cache_key or (response_id if body.store else None)}
    effort = body.reasoning.effort if body.reasoning is not None else None
    fields["reasoning_effort"] = effort  # the chat route's own field (templates such as gpt-oss's read it)
    fields |= thinking_switch(state.engine.tokenizer.chat_template, None if effort is None else
                              effort not in ("none", "minimal"))
    chat = chat_request({k: v for k, v in fields.items() if v is not None}, _PARAMS)
    adapter = ResponsesView.adapter(request_body=body, response_id=response_id, conversation=conversation,
                                    store=store)
    try:
        response = await chat_response(chat, request, adapter)
    except APIError as e:
        raise _renamed(e, origins) from None
    return named_events(response, _error_event)


@router.get("/v1/responses/{response_id}", responses=error_responses(404))
async def get_response(response_id: str, request: Request) -> dict[str, Any]:
    stored = response_store(request).get(response_id)
    if stored is None:
        raise APIError(404, f"no stored response {response_id!r}", "response_id", kind="not_found_error")
    return stored.body


@router.delete("/v1/responses/{response_id}", responses=error_responses(404))
async def delete_response(response_id: str, request: Request) -> dict[str, Any]:
    """Forgets a stored response and releases its pinned KV."""
    if not response_store(request).delete(response_id):
        raise APIError(404, f"no stored response {response_id!r}", "response_id", kind="not_found_error")
    # the pin's session is the tenant's own name for the id (the chat route scoped the prompt_cache_key)
    await asyncio.to_thread(server_state(request).engine.release_cache_key, tenant_of(request).scoped(response_id))
    return {"id": response_id, "object": "response.deleted", "deleted": True}


# ---- the request as chat fields -------------------------------------------------------------------
def input_messages(items: str | list[dict[str, Any]], origins: list[str]) -> list[dict[str, Any]]:
    """`input` as chat messages: a string is one user message; consecutive function_call items join one
    assistant message's tool_calls; reasoning items are dropped (templates drop past reasoning too).
    `origins` gets the item each message came from."""
    if isinstance(items, str):
        origins.append("input")
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        param = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise APIError(400, "a message's role is 'user', 'system', 'developer' or 'assistant', got "
                                    f"{role!r}", f"{param}.role")
            # templates know system, not OpenAI's newer developer
            messages.append({"role": "system" if role == "developer" else role,
                             "content": _content(item.get("content"), f"{param}.content")})
        elif kind == "function_call":
            call = {"id": _text_field(item, "call_id", param), "type": "function",
                    "function": {"name": _text_field(item, "name", param),
                                 "arguments": _text_field(item, "arguments", param)}}
            if messages and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": _text_field(item, "call_id", param),
                             "content": output if isinstance(output, str) else
                             _joined_text(output, f"{param}.output")})
        elif kind != "reasoning":
            raise APIError(400, f"input items are messages, function_call, function_call_output and reasoning; "
                                f"got type {kind!r}", f"{param}.type")
        origins.extend([param] * (len(messages) - len(origins)))  # this item's new message, if it made one
    return messages


_CHAT_PARAM = re.compile(r"^messages\[(\d+)\](.*)$")


def _renamed(e: APIError, origins: list[str]) -> APIError:
    """A chat-route error about messages[k] named by the input item (or field) message k came from."""
    match = _CHAT_PARAM.match(e.param or "")
    if match is None or int(match.group(1)) >= len(origins):
        return e
    origin, rest = origins[int(match.group(1))], match.group(2).replace(".tool_call_id", ".call_id")
    param = origin + rest if origin.startswith("input[") else origin
    return APIError(e.status, e.message.replace(e.param or "", param), param, e.kind)


def _text_field(item: dict[str, Any], name: str, param: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise APIError(400, f"{name} must be a string", f"{param}.{name}")
    return value


def _content(content: object, param: str) -> str | list[dict[str, Any]]:
    """A message's content as chat content: text parts, and image parts for input_image."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(400, "content must be a string or a list of content parts", param)
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text") and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        elif kind == "input_image":
            raise APIError(400, "an input_image needs image_url (a data URL); file_id is not supported",
                           f"{param}[{j}].image_url")
        else:
            raise APIError(400, f"content parts are input_text, output_text and input_image; got {kind!r}",
                           f"{param}[{j}]")
    return parts


def _joined_text(parts: object, param: str) -> str:
    content = _content(parts, param)
    if isinstance(content, str) or any(p["type"] != "text" for p in content):
        raise APIError(400, "a function call's output is a string or input_text parts", param)
    return "".join(p["text"] for p in content)


def _tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Responses' flat function tools as chat's nested ones."""
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise APIError(400, f"only function tools are supported, got type {tool.get('type')!r}",
                           f"tools[{i}].type")
        fn = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise APIError(400, "tool_choice is 'none', 'auto', 'required' or {'type': 'function', 'name': ...}",
                   "tool_choice")


def _response_format(body: ResponsesRequest) -> dict[str, Any] | None:
    fmt = body.text.format if body.text is not None else None
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise APIError(400, "a json_schema format needs schema, a JSON schema object", "text.format.schema")
        schema = {k: fmt[k] for k in ("name", "description", "schema", "strict") if fmt.get(k) is not None}
        return {"type": "json_schema", "json_schema": schema}
    raise APIError(400, f"text.format.type is 'text', 'json_object' or 'json_schema', got {fmt.get('type')!r}",
                   "text.format.type")


def _error_event(error: dict[str, Any]) -> dict[str, Any]:
    return {"type": "error", "code": str(error.get("code")), "message": error.get("message"),
            "param": error.get("param")}


# ---- the reply as a response ----------------------------------------------------------------------
@dataclass
class ResponsesView(ProtocolView):
    request_body: ResponsesRequest = field(kw_only=True)
    response_id: str = field(kw_only=True)
    conversation: list[dict[str, Any]] = field(kw_only=True)  # what the reply continues (stored with it)
    store: TenantResponses = field(kw_only=True)
    item_ids: dict[int, str] = field(default_factory=dict, kw_only=True)  # block -> its output item's id
    sequence: int = field(default=0, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.job.id = self.response_id  # the engine's rid: /abort takes the response id

    def whole_body(self, blocks: list[Block], ending: Ending) -> dict[str, Any]:
        return self._finished(blocks, ending)

    def opening(self) -> list[dict[str, Any]]:
        response = self._response("in_progress", [], None)
        return [self._emit("response.created", response=response),
                self._emit("response.in_progress", response=response)]

    def on_block(self, event: BlockEvent) -> list[dict[str, Any]]:
        i, block = event.index, event.block
        at = {"item_id": self._item_id(i, block), "output_index": i}
        if block.kind == "call":
            if event.action == "open":
                return [self._emit("response.output_item.added", output_index=i, item=self._item(i, block, False))]
            if event.action == "delta":
                return [self._emit("response.function_call_arguments.delta", **at, delta=event.piece)]
            return [self._emit("response.function_call_arguments.done", **at, name=block.name, arguments=block.text),
                    self._emit("response.output_item.done", output_index=i, item=self._item(i, block, True))]
        # text and reasoning: an item with one content part
        at["content_index"] = 0
        kind = "output_text" if block.kind == "text" else "reasoning_text"
        extra: dict[str, Any] = {"logprobs": []} if block.kind == "text" else {}
        if event.action == "open":
            return [self._emit("response.output_item.added", output_index=i, item=self._item(i, block, False)),
                    self._emit("response.content_part.added", **at, part=self._part(block))]
        if event.action == "delta":
            return [self._emit(f"response.{kind}.delta", **at, delta=event.piece, **extra)]
        return [self._emit(f"response.{kind}.done", **at, text=block.text, **extra),
                self._emit("response.content_part.done", **at, part=self._part(block)),
                self._emit("response.output_item.done", output_index=i, item=self._item(i, block, True))]

    def closing(self, ending: Ending) -> list[dict[str, Any]]:
        response = self._finished(self.blocks.blocks, ending)
        kind = "response.completed" if response["status"] == "completed" else "response.incomplete"
        return [self._emit(kind, response=response)]

    # ---- shapes -----------------------------------------------------------------------------------
    def _finished(self, blocks: list[Block], ending: Ending) -> dict[str, Any]:
        """The whole response, stored when asked."""
        status = "incomplete" if ending.finish_reason == "length" else "completed"
        output = [self._item(i, b, True) for i, b in enumerate(blocks)]
        response = self._response(status, output, ending, blocks)
        if self.request_body.store:
            self.store.put(self.response_id, response, [*self.conversation, _assistant_message(blocks)])
        return response

    def _response(self, status: str, output: list[dict[str, Any]], ending: Ending | None,
                  blocks: list[Block] | None = None) -> dict[str, Any]:
        body = self.request_body
        fmt = body.text.format if body.text is not None and body.text.format is not None else {"type": "text"}
        reasoning = body.reasoning.model_dump() if body.reasoning is not None else {"effort": None, "summary": None}
        return {
            "id": self.response_id, "object": "response", "created_at": self.job.created, "status": status,
            "background": False, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens, "model": body.model,
            "output": output, "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id, "reasoning": reasoning, "store": body.store,
            "temperature": body.temperature, "top_p": body.top_p, "text": {"format": fmt},
            "tool_choice": body.tool_choice or "auto", "tools": body.tools or [], "truncation": "disabled",
            "metadata": body.metadata or {}, "user": body.user,
            "usage": None if ending is None else self._usage(ending, blocks or [])}

    def _usage(self, ending: Ending, blocks: list[Block]) -> dict[str, Any]:
        tokenizer = self.state.engine.tokenizer
        reasoning = sum(len(tokenizer.encode(b.text)) for b in blocks if b.kind == "reasoning")
        return {"input_tokens": ending.prompt_tokens, "input_tokens_details": {"cached_tokens": ending.cached_tokens},
                "output_tokens": ending.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": min(reasoning, ending.completion_tokens)},
                "total_tokens": ending.prompt_tokens + ending.completion_tokens}

    def _item_id(self, index: int, block: Block) -> str:
        prefix = {"reasoning": "rs", "text": "msg", "call": "fc"}[block.kind]
        return self.item_ids.setdefault(index, new_id(prefix, "_"))

    def _item(self, index: int, block: Block, done: bool) -> dict[str, Any]:
        status = "completed" if done else "in_progress"
        item_id = self._item_id(index, block)
        if block.kind == "call":
            return {"type": "function_call", "id": item_id, "call_id": block.call_id, "name": block.name,
                    "arguments": block.text if done else "", "status": status}
        if block.kind == "reasoning":
            return {"type": "reasoning", "id": item_id, "summary": [],
                    "content": [self._part(block)] if done else [], "status": status}
        return {"type": "message", "id": item_id, "role": "assistant", "status": status,
                "content": [self._part(block)] if done else []}

    @staticmethod
    def _part(block: Block) -> dict[str, Any]:
        if block.kind == "reasoning":
            return {"type": "reasoning_text", "text": block.text}
        return {"type": "output_text", "text": block.text, "annotations": [], "logprobs": []}

    def _emit(self, kind: str, **fields: Any) -> dict[str, Any]:  # noqa: ANN401 - an event's JSON fields
        self.sequence += 1
        return {"type": kind, "sequence_number": self.sequence - 1, **fields}


def _assistant_message(blocks: list[Block]) -> dict[str, Any]:
    """The reply as the next request's history: its text and calls (reasoning is not sent back)."""
    text = "".join(b.text for b in blocks if b.kind == "text")
    calls = [{"id": b.call_id, "type": "function", "function": {"name": b.name, "arguments": b.text}}
             for b in blocks if b.kind == "call"]
    return {"role": "assistant", "content": text or (None if calls else ""), **({"tool_calls": calls} if calls else {})}
