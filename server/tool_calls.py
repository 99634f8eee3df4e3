"""OpenAI tool calling on /v1/chat/completions: the request's tools checked and turned into a structural
tag, the history's calls and results shaped for the chat template, and the reply's calls as
`message.tool_calls` (whole) or `delta.tool_calls` (streamed; the joined chunks equal the whole reply).

Flow: `plan_tools` (400s name the field) -> `sampling_params["structural_tag"]` (the engine's ordinary
constraint field) and `template_messages` (chat_prompt) -> engine -> `reply_message` / `ToolStream`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from ..runtime.tool_formats import (
    ParsedCalls,
    ToolCall,
    ToolFormat,
    detect_format,
    fallback_messages,
    held_back,
    new_call_id,
    parse_tool_calls,
    tool_call_structural_tag,
)
from .errors import APIError
from .protocol import ChatCompletionRequest, ChatMessage


@dataclass(slots=True)
class ToolPlan:
    fmt: ToolFormat
    tools: list[dict[str, Any]]  # the OpenAI function objects: name, description, parameters
    choice: str  # "none" | "auto" | "required" | a tool's name
    parallel: bool
    structural_tag: dict[str, Any] | None  # the constraint (None with "none")

    @property
    def parses(self) -> bool:
        return self.choice != "none"


def plan_tools(body: ChatCompletionRequest, chat_template: str | None,
               compile_tag: Callable[[dict[str, Any]], Any], fmt: ToolFormat | None = None) -> ToolPlan | None:
    """The request's tool plan, or None without tools. `compile_tag` compiles the constraint (a cache hit
    for the engine later), so that a schema it cannot compile is a 400 naming the tool. `fmt`: the
    server's tool-call format (--tool-call-parser), else the one the template renders."""
    if not body.tools:
        if body.tool_choice not in (None, "none"):
            raise APIError(400, "tool_choice needs tools", "tool_choice")
        return None
    tools = _functions(body.tools)
    choice = _choice(body.tool_choice, {t["name"] for t in tools})
    if choice != "none" and body.response_format is not None and body.response_format.type != "text":
        raise APIError(400, "response_format cannot be combined with tools unless tool_choice is 'none'",
                       "response_format")
    parallel = body.parallel_tool_calls is not False
    fmt = fmt or detect_format(chat_template)
    tag = None
    if choice != "none":
        chosen = tools if choice in ("auto", "required") else [t for t in tools if t["name"] == choice]
        tag = tool_call_structural_tag(fmt, chosen, "auto" if choice == "auto" else "required", parallel)
        _compile(tag, tools, compile_tag)
    return ToolPlan(fmt, tools, choice, parallel, tag)


def _functions(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out, seen = [], set()
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            raise APIError(400, "each tool must be {'type': 'function', 'function': {...}}", f"tools[{i}]")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise APIError(400, "a tool needs a non-empty name", f"tools[{i}].function.name")
        if name in seen:
            raise APIError(400, f"tool name {name!r} appears twice", f"tools[{i}].function.name")
        seen.add(name)
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict) or params.get("type", "object") != "object":
            raise APIError(400, f"tool {name!r}: parameters must be a JSON schema of type 'object'",
                           f"tools[{i}].function.parameters")
        out.append({"name": name, "description": fn.get("description", ""), "parameters": params})
    return out


def _choice(choice: object, names: set[str]) -> str:
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise APIError(400, f"tool_choice must be 'none', 'auto', 'required' or a named function, got {choice!r}",
                           "tool_choice")
        return choice
    fn = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise APIError(400, "a named tool_choice is {'type': 'function', 'function': {'name': ...}}", "tool_choice")
    if name not in names:
        raise APIError(400, f"tool_choice names {name!r}, which is not among the tools {sorted(names)}",
                       "tool_choice.function.name")
    return name


def _compile(tag: dict[str, Any], tools: list[dict[str, Any]], compile_tag: Callable[[dict[str, Any]], Any]) -> None:
    """Compiles each tool's schema alone first only when the whole fails, to name the tool."""
    try:
        compile_tag(tag)
        return
    except ValueError as whole:
        error = whole
    for i, t in enumerate(tools):
        try:
            compile_tag({"type": "structural_tag", "structures": [
                {"begin": "<", "schema": t["parameters"], "end": ">"}], "triggers": ["<"]})
        except ValueError as e:
            raise APIError(400, f"tool {t['name']!r}: its parameters schema cannot be enforced: {e}",
                           f"tools[{i}].function.parameters") from None
    raise APIError(400, f"tools: {error}", "tools")


# ---- history --------------------------------------------------------------------------------------
def template_messages(messages: list[ChatMessage], rendered: list[dict[str, Any]],
                      plan: ToolPlan | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The messages as the chat template gets them (tool calls with dict arguments, as transformers
    passes them), and its extra arguments (tools=, for templates that render tools)."""
    calls: set[str] = set()
    for i, (m, out) in enumerate(zip(messages, rendered)):
        if m.tool_calls:
            out["tool_calls"] = [_history_call(c, f"messages[{i}].tool_calls[{j}]") for j, c in enumerate(m.tool_calls)]
            calls |= {c["id"] for c in out["tool_calls"] if c.get("id")}
        if m.role == "tool":
            if m.tool_call_id is None or m.tool_call_id not in calls:
                raise APIError(400, f"tool_call_id {m.tool_call_id!r} matches no earlier assistant tool call",
                               f"messages[{i}].tool_call_id")
            out["tool_call_id"] = m.tool_call_id
    if plan is None:
        fmt = detect_format(None) if any(m.tool_calls or m.role == "tool" for m in messages) else None
        return (fallback_messages(rendered, []) if fmt is not None else rendered), {}
    if not plan.fmt.renders_tools:
        return fallback_messages(rendered, plan.tools), {}
    return rendered, {"tools": [{"type": "function", "function": t} for t in plan.tools]}


def _history_call(call: object, param: str) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(call, dict) or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise APIError(400, "a tool call is {'id', 'type': 'function', 'function': {'name', 'arguments'}}", param)
    args = fn.get("arguments", "{}")
    if isinstance(args, str):
        try:
            args = json.loads(args or "{}")
        except json.JSONDecodeError as e:
            raise APIError(400, f"function.arguments is not valid JSON: {e}", f"{param}.function.arguments") from None
    if not isinstance(args, dict):
        raise APIError(400, "function.arguments must be a JSON object", f"{param}.function.arguments")
    return {"id": call.get("id"), "type": "function", "function": {"name": fn["name"], "arguments": args}}


# ---- the reply ------------------------------------------------------------------------------------
def openai_call(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)}}


def reply_message(plan: ToolPlan, text: str, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
    """The assistant message of a whole reply and its finish_reason ("tool_calls" when it calls)."""
    parsed = _parsed(plan, text)
    if not parsed.calls:
        return {"role": "assistant", "content": text}, finish_reason
    message = {"role": "assistant", "content": parsed.content or None,
               "tool_calls": [openai_call(c) for c in parsed.calls]}
    return message, "tool_calls" if finish_reason == "stop" else finish_reason


def _parsed(plan: ToolPlan, text: str) -> ParsedCalls:
    parsed = parse_tool_calls(plan.fmt, text)
    for c in parsed.calls:
        c.id = new_call_id(plan.fmt)
    return parsed


@dataclass
class ToolStream:
    """One choice's text as OpenAI streams a reply with tools: content deltas up to the first call's
    trigger (a partial trigger held back), then each call once its JSON is complete: a delta with its
    index, id and name, then one with its arguments."""

    plan: ToolPlan
    text: str = ""
    sent_content: int = 0
    calls: list[ToolCall] = field(default_factory=list)

    def feed(self, piece: str, finished: bool) -> tuple[str, list[dict[str, Any]]]:
        """The content to send now and the tool_calls deltas to send now."""
        self.text += piece
        parsed = parse_tool_calls(self.plan.fmt, self.text)
        trigger_at = self.text.find(self.plan.fmt.trigger)
        if trigger_at < 0:
            upto = len(self.text) if finished else len(self.text) - held_back(self.plan.fmt, self.text)
        elif finished and not parsed.calls:
            upto = len(self.text)  # a call that never parsed: the text was content after all
        else:
            upto = trigger_at
        content = self.text[self.sent_content:max(upto, self.sent_content)]
        self.sent_content = max(upto, self.sent_content)
        return content, self._new_calls(parsed.calls)

    def _new_calls(self, calls: list[ToolCall]) -> list[dict[str, Any]]:
        deltas = []
        for call in calls[len(self.calls):]:
            call.id = new_call_id(self.plan.fmt)
            index = len(self.calls)
            self.calls.append(call)
            whole = openai_call(call)
            deltas.append({"index": index, "id": call.id, "type": "function",
                           "function": {"name": call.name, "arguments": ""}})
            deltas.append({"index": index, "function": {"arguments": whole["function"]["arguments"]}})
        return deltas

    def finish_reason(self, reason: str | None) -> str | None:
        return "tool_calls" if self.calls and reason == "stop" else reason
