"""Tools in programs: a Python function, a pydantic model or a JSON schema becomes a `Tool`;
`gen(name, tools=..., tool_choice=...)` generates calls valid for their schemas (a structural tag, in
the fallback format of runtime/tool_formats, so it works on any model and backend) and `state[name]`
holds the parsed calls; `tool_results` runs them and appends their results to the conversation.

The tools travel in the IR as the gen's structural tag, so a program runs server-side too
(`remote=True`); the Python functions themselves are only called on the client, by `tool_results`.
"""
from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from ..runtime.tool_formats import (
    FALLBACK,
    FALLBACK_SYSTEM,
    ToolCall,
    held_back,
    parse_tool_calls,
    render_call,
    tool_call_structural_tag,
)

TOOL_CHOICES = ("auto", "required")


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # a JSON schema of type object
    fn: Callable[..., Any] | None = None  # called by tool_results (None: a schema only)

    def spec(self) -> dict[str, Any]:
        """The OpenAI function object."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}


# what a tool is made from (a pydantic model class is a callable)
ToolSource = Tool | Callable[..., Any] | dict[str, Any]


def tool(obj: ToolSource) -> Tool:
    """A tool from a function (its signature and docstring), a pydantic model class (its schema and
    docstring), an OpenAI function dict (`{"type": "function", "function": {...}}` or the inner object),
    or a Tool."""
    if isinstance(obj, Tool):
        return obj
    if isinstance(obj, dict):
        fn = obj.get("function", obj) if obj.get("type") == "function" else obj
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ValueError(f"a tool dict needs a name, got {obj!r}")
        return Tool(fn["name"], fn.get("description", ""), _object_schema(fn.get("parameters"), fn["name"]))
    if isinstance(obj, type) and hasattr(obj, "model_json_schema"):
        schema = _untitled(obj.model_json_schema())
        schema.pop("description", None)
        return Tool(obj.__name__, inspect.getdoc(obj) or "", _object_schema(schema, obj.__name__))
    if callable(obj):
        return Tool(obj.__name__, inspect.getdoc(obj) or "", signature_schema(obj), obj)
    raise TypeError(f"a tool is a function, a pydantic model class or a JSON schema dict, got {type(obj).__name__}")


def signature_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """The JSON schema of a function's parameters (their annotations; a default makes one optional)."""
    import pydantic

    fields = {}
    for name, p in inspect.signature(fn).parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ValueError(f"tool {fn.__name__!r}: *args and **kwargs have no schema")
        hint = Any if p.annotation is inspect.Parameter.empty else p.annotation
        fields[name] = (hint, ... if p.default is inspect.Parameter.empty else p.default)
    # pydantic's stubs type each field keyword apart; a dict of (type, default) definitions is what it takes
    model = pydantic.create_model(fn.__name__, **fields)  # type: ignore[call-overload]
    return _untitled(model.model_json_schema())


def _untitled(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema without pydantic's generated titles (noise in a prompt)."""
    return {k: _untitled_value(v) for k, v in schema.items() if k != "title" or not isinstance(v, str)}


def _untitled_value(value: object) -> object:
    if isinstance(value, dict):
        return _untitled(value)
    if isinstance(value, list):
        return [_untitled_value(x) for x in value]
    return value


def _object_schema(schema: object, name: str) -> dict[str, Any]:
    schema = {"type": "object", "properties": {}} if schema is None else schema
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        raise ValueError(f"tool {name!r}: parameters must be a JSON schema of type 'object'")
    return schema


def as_tools(tools: Iterable[ToolSource]) -> list[Tool]:
    out = [tool(t) for t in tools]
    names = [t.name for t in out]
    if not out or len(set(names)) != len(names):
        raise ValueError(f"tools must be a non-empty list with distinct names, got {names}")
    return out


def tool_gen_tag(tools: list[Tool], tool_choice: str, parallel_tool_calls: bool) -> dict[str, Any]:
    """The structural tag of gen(tools=...): "auto" (text or calls), "required", or one tool's name."""
    if tool_choice in TOOL_CHOICES:
        return tool_call_structural_tag(FALLBACK, [t.spec() for t in tools], tool_choice, parallel_tool_calls)
    chosen = [t for t in tools if t.name == tool_choice]
    if not chosen:
        raise ValueError(f"tool_choice must be 'auto', 'required' or one of the tools' names "
                         f"{[t.name for t in tools]}, got {tool_choice!r}")
    return tool_call_structural_tag(FALLBACK, [chosen[0].spec()], "required", parallel_tool_calls)


def parsed_calls(text: str, meta: dict[str, Any] | None = None, name: str | None = None) -> list[dict[str, Any]]:
    """The calls of a tool gen's text, as the variable holds them: [{"name", "arguments"}, ...].

    A call cut off by max_tokens (the meta's finish_reason says "length") is never passed off as the
    model's answer: with no complete call before it, it is an error (state.error()); after complete calls,
    the variable holds those and the meta says `tool_call_cut_off: True`. So it does when the engine closed
    the last call for max_tokens (runtime/constrained/closing.py): whole, but maybe shortened."""
    parsed = parse_tool_calls(FALLBACK, text)
    reason = (meta or {}).get("finish_reason")
    cut = isinstance(reason, dict) and reason.get("type") == "length"
    began = FALLBACK.trigger in text or held_back(FALLBACK, text) > 0
    incomplete = parsed.invalid or (cut and began and not text.rstrip().endswith(FALLBACK.call_end))
    if incomplete and not parsed.calls:
        why = "max_tokens cut it off (finish_reason 'length')" if cut else "it does not parse"
        raise ValueError(f"gen {name!r}: a tool call is incomplete: {why}; raise max_tokens. Text: {text!r}")
    if meta is not None and parsed.calls:
        meta["tool_call_cut_off"] = bool(incomplete or cut)
    return [{"name": c.name, "arguments": c.arguments} for c in parsed.calls]


def tools_prompt(tools: Iterable[ToolSource]) -> str:
    """The text that lists the tools and how to call them (for the system turn)."""
    return FALLBACK_SYSTEM.format(tools="\n".join(json.dumps(t.spec(), ensure_ascii=False) for t in as_tools(tools)))


def tool_results(calls: list[dict[str, Any]], tools: Iterable[ToolSource]) -> str:
    """Runs each call's function (on this machine) and returns the user turn's text of their results, as
    <tool_response> blocks (append it with `s += rl.user(rl.tool_results(s["call"], tools))`)."""
    by_name = {t.name: t for t in as_tools(tools)}
    if not calls:
        raise ValueError("tool_results got no calls: the gen made none (with tool_choice 'auto' the model may "
                         "answer in text; check the variable before running tools)")
    out = []
    for call in calls:
        t = by_name.get(call["name"])
        if t is None or t.fn is None:
            raise ValueError(f"no Python function for tool {call['name']!r}")
        result = t.fn(**call["arguments"])
        text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)
        out.append(f"<tool_response>\n{text}\n</tool_response>")
    return "\n".join(out)


def call_text(name: str, arguments: dict[str, Any]) -> str:
    """A call as the program's conversation writes it (e.g. a few-shot example)."""
    return render_call(FALLBACK, ToolCall(name, arguments))
