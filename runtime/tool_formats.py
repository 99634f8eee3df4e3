"""Tool calls in model text: one table of formats by model family, the constraint that makes a call
valid by construction, and the parser that reads calls back out of the text.

A format is detected from the chat template (the markers its own rendering of a call uses). A template
that does not render tools (SmolLM2's) gets the documented fallback: the tools listed in the system turn
and calls written as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

The constraint is a structural tag (constrained/structural_tag.py): with tool_choice "auto" free text
until the format's trigger, then a call of a listed tool with arguments valid for its schema; with
"required" or a named tool, calls only. Either way the parser below reads what the constraint produced.
"""
from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass, field
from typing import Any

NAME = "{name}"  # where a call's begin marker holds the tool's name (JSON-escaped)
FALLBACK_SYSTEM = ("You can call these tools. To call one, reply with <tool_call>{{\"name\": <tool name>, "
                   "\"arguments\": <arguments as a JSON object>}}</tool_call> (one per call).\n"
                   "Tools:\n{tools}")


@dataclass(frozen=True, slots=True)
class ToolFormat:
    name: str
    trigger: str  # the text that starts a call (or, for an array format, the calls)
    call_begin: str  # one call up to its arguments, with NAME for the tool's name
    call_end: str  # after the arguments
    separator: str  # between calls in one turn
    args_key: str = "arguments"
    json_start: int = 0  # where the call's JSON begins, counted from the trigger's start
    array: bool = False  # the calls are one JSON array after the trigger (Mistral)
    renders_tools: bool = True  # the template takes tools= and tool_calls itself
    call_id_chars: int = 0  # >0: ids of exactly this many letters and digits (Mistral's templates check it)


# the table: markers as each family's chat template renders a call (what its model was trained on)
HERMES = ToolFormat("hermes", "<tool_call>", '<tool_call>\n{"name": "{name}", "arguments": ', "}\n</tool_call>",
                    "\n", json_start=len("<tool_call>"))
LLAMA3_JSON = ToolFormat("llama3_json", '{"name"', '{"name": "{name}", "parameters": ', "}", "; ",
                         args_key="parameters")
MISTRAL = ToolFormat("mistral", "[TOOL_CALLS]", "[TOOL_CALLS] ", "", ", ", json_start=len("[TOOL_CALLS]"),
                     array=True, call_id_chars=9)
FALLBACK = ToolFormat("radixlang", "<tool_call>", '<tool_call>{"name": "{name}", "arguments": ', "}</tool_call>",
                      "\n", json_start=len("<tool_call>"), renders_tools=False)
FORMATS = {f.name: f for f in (HERMES, LLAMA3_JSON, MISTRAL, FALLBACK)}


def detect_format(chat_template: str | None) -> ToolFormat:
    """The format a chat template renders calls in; the fallback for a template without tools."""
    template = chat_template or ""
    if "tools" not in template:
        return FALLBACK
    if "[TOOL_CALLS]" in template:
        return MISTRAL
    if "<tool_call>" in template:
        return HERMES
    if "<|python_tag|>" in template or '"parameters"' in template:
        return LLAMA3_JSON
    return FALLBACK


@dataclass(slots=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str = ""


@dataclass(slots=True)
class ParsedCalls:
    content: str  # the text before the first call (all of it when there is no call)
    calls: list[ToolCall] = field(default_factory=list)
    invalid: bool = False  # a call began but did not parse (only without the constraint)


# ---- the constraint -------------------------------------------------------------------------------
def tool_call_structural_tag(fmt: ToolFormat, tools: list[dict[str, Any]], choice: str,
                             parallel: bool = True) -> dict[str, Any]:
    """The structural tag for `tools` ({"name", "parameters"} each): choice "auto" allows text before the
    calls; "required" (or one tool's name, with `tools` narrowed to it) allows calls only."""
    if fmt.array:
        tags = [{"type": "tag", "begin": fmt.call_begin, "content": {
            "type": "json_schema", "json_schema": _array_schema(fmt, tools, parallel)}, "end": fmt.call_end}]
    else:
        tags = [{"type": "tag", "begin": fmt.call_begin.replace(NAME, _escaped(t["name"])),
                 "content": {"type": "json_schema", "json_schema": parameters_schema(t)}, "end": fmt.call_end}
                for t in tools]
    body: dict[str, Any]
    if choice == "auto":
        body = {"type": "triggered_tags", "triggers": [fmt.trigger], "tags": tags}
    else:
        # calls back to back, no separator: where a separator (a newline) may follow a call, a weak model
        # writes it and then, the next call's begin being forced, repeats the call until max_tokens (SmolLM2:
        # 0 of 8 prompts ended). Without one, after each call the model chooses between another call's
        # begin and the end of its turn: the list ends when the model ends it (8 of 8)
        body = {"type": "tags_with_separator", "tags": tags, "separator": "", "at_least_one": True}
    return {"type": "structural_tag", "format": body | {"stop_after_first": not parallel or fmt.array}}


def parameters_schema(tool: dict[str, Any]) -> dict[str, Any]:
    return tool.get("parameters") or {"type": "object", "properties": {}}


def _array_schema(fmt: ToolFormat, tools: list[dict[str, Any]], parallel: bool) -> dict[str, Any]:
    calls = [{"type": "object", "properties": {"name": {"const": t["name"]}, fmt.args_key: parameters_schema(t)},
              "required": ["name", fmt.args_key], "additionalProperties": False} for t in tools]
    item = calls[0] if len(calls) == 1 else {"anyOf": calls}
    return {"type": "array", "items": item, "minItems": 1} | ({} if parallel else {"maxItems": 1})


def _escaped(name: str) -> str:
    return json.dumps(name, ensure_ascii=False)[1:-1]


# ---- reading calls back ---------------------------------------------------------------------------
def parse_tool_calls(fmt: ToolFormat, text: str) -> ParsedCalls:
    """The calls in `text`, in order, and the text before the first. A call that does not parse ends the
    reading (and makes the whole text content when no call came before it)."""
    pos = text.find(fmt.trigger)
    if pos < 0:
        return ParsedCalls(text)
    calls: list[ToolCall] = []
    decoder = json.JSONDecoder()
    content = text[:pos]
    while pos >= 0:
        start = pos + fmt.json_start
        start += len(text[start:]) - len(text[start:].lstrip())
        try:
            value, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            return ParsedCalls(content if calls else text, calls, invalid=True)
        items = value if fmt.array and isinstance(value, list) else [value]
        read = [c for c in (_call(fmt, item) for item in items) if c is not None]
        if not read or len(read) != len(items):
            return ParsedCalls(content if calls else text, calls, invalid=True)
        calls.extend(read)
        pos = text.find(fmt.trigger, end)
    return ParsedCalls(content, calls)


def _call(fmt: ToolFormat, item: object) -> ToolCall | None:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    args = item.get(fmt.args_key, item.get("arguments"))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    return ToolCall(item["name"], args) if isinstance(args, dict) else None


def held_back(fmt: ToolFormat, text: str) -> int:
    """How many trailing characters of `text` might begin the trigger (a stream holds them back)."""
    for n in range(min(len(fmt.trigger) - 1, len(text)), 0, -1):
        if fmt.trigger.startswith(text[-n:]):
            return n
    return 0


def new_call_id(fmt: ToolFormat) -> str:
    if fmt.call_id_chars:
        return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(fmt.call_id_chars))
    return f"call_{secrets.token_hex(12)}"


# ---- rendering ------------------------------------------------------------------------------------
def render_call(fmt: ToolFormat, call: ToolCall) -> str:
    """One call as the format writes it (the fallback's history, and tests' expected text)."""
    args = json.dumps(call.arguments, ensure_ascii=False)
    if fmt.array:
        return f"{fmt.call_begin}{json.dumps([{'name': call.name, fmt.args_key: call.arguments}], ensure_ascii=False)}"
    return f"{fmt.call_begin.replace(NAME, _escaped(call.name))}{args}{fmt.call_end}"


def fallback_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A conversation with tools for a template that renders none: the tools in the system turn, calls in
    the assistant's text, tool results as user turns in <tool_response> tags."""
    out = []
    listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    for m in messages:
        if m.get("tool_calls"):
            calls = [ToolCall(c["function"]["name"], c["function"]["arguments"]) for c in m["tool_calls"]]
            text = (m.get("content") or "") + "".join(render_call(FALLBACK, c) for c in calls)
            out.append({"role": "assistant", "content": text})
        elif m["role"] == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"})
        else:
            out.append({"role": m["role"], "content": m.get("content")})
    if tools:
        system = FALLBACK_SYSTEM.format(tools=listed)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{system}"}
        else:
            out.insert(0, {"role": "system", "content": system})
    return out
