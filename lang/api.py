"""The primitives a program appends (SGLang's names): gen, select, image, roles."""
from __future__ import annotations

import json
from typing import Any

from .choices import ChoiceMethod, method_key, token_length_normalized
from .default_backend import BackendArg, as_backend
from .gen_params import GEN_FIELDS, GenParams, stop_list
from .images import ImageSource, load_image
from .ir import (
    Appendable,
    Gen,
    Image,
    Placeholder,
    RoleBegin,
    RoleEnd,
    Select,
    SeparateReasoning,
    Seq,
    TraceError,
    check_choices,
    check_select,
)
from .reasoning import reasoning_format
from .tools import as_tools, tool_gen_tag

_DTYPES = {int: "int", float: "float", bool: "bool", str: "str"}


def gen(name: str | None = None, max_tokens: int | None = None, min_tokens: int | None = None, n: int | None = None,
        stop: str | list[str] | None = None, stop_token_ids: list[int] | None = None,
        stop_regex: str | list[str] | None = None, temperature: float | None = None, top_p: float | None = None,
        top_k: int | None = None, min_p: float | None = None, frequency_penalty: float | None = None,
        presence_penalty: float | None = None, ignore_eos: bool | None = None, return_logprob: bool | None = None,
        logprob_start_len: int | None = None, top_logprobs_num: int | None = None,
        return_text_in_logprobs: bool | None = None, dtype: type | str | None = None,
        choices: list[str] | None = None, choices_method: str | ChoiceMethod | None = None, regex: str | None = None,
        json_schema: str | dict | type | None = None, *, grammar: str | None = None,
        structural_tag: str | dict | None = None, tools: list | None = None, tool_choice: str = "auto",
        parallel_tool_calls: bool = True, thinking_token_budget: int | None = None,
        reasoning_parser: str | None = None, lora: str | None = None) -> Gen | Select:
    """Generate text into variable `name`. Unset fields inherit the run's defaults. The positional order is
    SGLang's (`gen("tip", 64, stop="\\n")` sets max_tokens); `grammar` (Lark), `structural_tag` and the tool
    fields are radixlang's, keyword-only.

    dtype (int, float, bool, str) constrains the output with a regex; regex / json_schema / grammar /
    structural_tag constrain it directly; choices makes this a `select`. The variable holds the
    generated text; with `tools` (functions, pydantic models or JSON schemas; see lang/tools.py) it holds
    the parsed calls, each valid for its tool's schema: tool_choice "auto" (text or calls), "required"
    or a tool's name. `n` must be 1 (fork the state for several samples).

    Reasoning models (docs/reasoning.md): `reasoning_parser` (SGLang's parser names; the server's
    --reasoning-parser by default) makes the thinking block come first and the constraint apply to the answer;
    `thinking_token_budget` (vLLM's name) closes the block after that many tokens.

    `lora`: the LoRA adapter (a name the backend serves, docs/lora.md) that generates; run(lora=...) sets it for
    every gen of a run.
    """
    fields = {k: v for k, v in locals().items() if k in GEN_FIELDS}  # first line: locals() are the arguments
    for field, value in fields.items():
        _concrete("gen", field, value)
    _check_var_name(name)
    if n not in (None, 1):
        raise ValueError(f"gen(n={n!r}): a variable holds one sample; fork the state (s.fork({n})) for several")
    if choices is not None:
        return select(name, choices, temperature=temperature or 0.0,
                      choices_method=choices_method or token_length_normalized)
    fields["stop"] = stop_list(stop)
    fields["stop_regex"] = stop_list(stop_regex)
    fields["dtype"] = _DTYPES.get(dtype, dtype) if isinstance(dtype, type) else dtype
    fields["json_schema"] = _schema_text(json_schema)
    if tools is not None:
        if any(fields.get(k) is not None for k in ("dtype", "regex", "json_schema", "grammar", "structural_tag")):
            raise ValueError("gen takes tools or another constraint (dtype, regex, json_schema, grammar, "
                             "structural_tag), not both")
        fields["structural_tag"] = tool_gen_tag(as_tools(tools), tool_choice, parallel_tool_calls)
        fields["tool_calls"] = True
    params = GenParams(**fields)
    params.validate()
    return Gen(name, params)


def gen_int(name: str | None = None, max_tokens: int | None = None, n: int | None = None,
            stop: str | list[str] | None = None, stop_token_ids: list[int] | None = None,
            stop_regex: str | list[str] | None = None, temperature: float | None = None, top_p: float | None = None,
            top_k: int | None = None, min_p: float | None = None, frequency_penalty: float | None = None,
            presence_penalty: float | None = None, ignore_eos: bool | None = None,
            return_logprob: bool | None = None, logprob_start_len: int | None = None,
            top_logprobs_num: int | None = None, return_text_in_logprobs: bool | None = None) -> Gen:
    """gen(name, ..., dtype=int): an integer (SGLang's positional order)."""
    node = gen(**{k: v for k, v in locals().items()}, dtype=int)
    assert isinstance(node, Gen), "gen without choices makes a Gen"
    return node


def gen_string(name: str | None = None, max_tokens: int | None = None, n: int | None = None,
               stop: str | list[str] | None = None, stop_token_ids: list[int] | None = None,
               stop_regex: str | list[str] | None = None, temperature: float | None = None,
               top_p: float | None = None, top_k: int | None = None, min_p: float | None = None,
               frequency_penalty: float | None = None, presence_penalty: float | None = None,
               ignore_eos: bool | None = None, return_logprob: bool | None = None,
               logprob_start_len: int | None = None, top_logprobs_num: int | None = None,
               return_text_in_logprobs: bool | None = None) -> Gen:
    """gen(name, ..., dtype=str): a double-quoted string (SGLang's positional order)."""
    node = gen(**{k: v for k, v in locals().items()}, dtype=str)
    assert isinstance(node, Gen), "gen without choices makes a Gen"
    return node


def select(name: str | None = None, choices: list[str] | None = None, temperature: float = 0.0,
           choices_method: str | ChoiceMethod = token_length_normalized) -> Select:
    """Append the choice the model finds most likely after the text so far, scored by `choices_method`."""
    _check_var_name(name)
    if isinstance(choices, Placeholder):
        source = choices.as_choices()
    else:
        _concrete("select", "choices", choices)
        source = check_choices(choices, f"select {name!r}")
    node = Select(name, source, method_key(choices_method), temperature)
    check_select(node, f"select {name!r}")
    return node


def image(expr: ImageSource | Placeholder) -> Image:
    """An image (a file path, bytes or a PIL image) at this point of the program."""
    if isinstance(expr, Placeholder):
        return Image(expr.as_image())
    return Image(load_image(expr))


def video(path: str, num_frames: int) -> Image:
    """SGLang's video input: not supported (radixlang's vision models take images, and no video decoder is
    installed); sample frames yourself and append each with image()."""
    raise NotImplementedError(f"video({path!r}, num_frames={num_frames!r}) is not supported: append sampled "
                              "frames with image() instead")


def _role(role: str, expr: Appendable | None) -> Seq:
    inner = [] if expr is None else [expr]
    return Seq([RoleBegin(role), *inner, RoleEnd(role)])


def system(expr: Appendable | None = None) -> Seq:
    return _role("system", expr)


def user(expr: Appendable | None = None) -> Seq:
    return _role("user", expr)


def assistant(expr: Appendable | None = None) -> Seq:
    return _role("assistant", expr)


def system_begin() -> RoleBegin:
    return RoleBegin("system")


def system_end() -> RoleEnd:
    return RoleEnd("system")


def user_begin() -> RoleBegin:
    return RoleBegin("user")


def user_end() -> RoleEnd:
    return RoleEnd("user")


def assistant_begin() -> RoleBegin:
    return RoleBegin("assistant")


def assistant_end() -> RoleEnd:
    return RoleEnd("assistant")


def separate_reasoning(expr: Appendable | None = None, model_type: str | None = None) -> Seq:
    """SGLang's: appends `expr`, then moves the reasoning (`<think>…</think>` and kin, by SGLang's reasoning
    parser `model_type`: "deepseek-r1", "qwen3", ...) out of each variable its gen / select sets into
    `<name>_reasoning_content`; the variable and the state's text keep the answer.
    `s += assistant(separate_reasoning(gen("answer"), model_type="deepseek-r1"))`."""
    reasoning_format(model_type)
    assert model_type is not None, "reasoning_format rejects a missing model_type"
    inner = [] if expr is None else [expr]
    return Seq([*inner, SeparateReasoning(_variables_of(expr), model_type)])


def _variables_of(expr: Appendable | None) -> list[str]:
    if isinstance(expr, (Gen, Select)):
        if expr.name is None:
            raise ValueError("separate_reasoning needs its gen / select named: the reasoning goes to "
                             "<name>_reasoning_content")
        return [expr.name]
    if isinstance(expr, Seq):
        return [name for item in expr.nodes for name in _variables_of(item)]
    return []


def _concrete(primitive: str, field: str, value: object) -> None:
    values = value if isinstance(value, (list, tuple)) else [value]
    for v in values:
        if isinstance(v, Placeholder):
            raise TraceError(f"{primitive}'s {field} depends on {v.describe()}, which is unknown while tracing; "
                             "the program still runs eagerly with .run()")


def _check_var_name(name: object) -> None:
    if isinstance(name, Placeholder):
        raise TraceError(f"a variable name depends on {name.describe()}, which is unknown while tracing")
    if name is not None and (not isinstance(name, str) or not name):
        raise ValueError(f"a variable name must be a non-empty string or None, got {name!r}")


def _schema_text(schema: object) -> str | None:
    """json_schema as a JSON string, from a string, a dict, or a pydantic model class."""
    if schema is None or isinstance(schema, str):
        return schema
    if isinstance(schema, dict):
        return json.dumps(schema)
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        return json.dumps(schema.model_json_schema())
    raise TypeError(f"json_schema must be a JSON string, a dict or a pydantic model class, got {type(schema).__name__}")


def get_server_info(backend: BackendArg = None) -> dict[str, Any]:
    """The server's configuration and live counters (default backend if none given)."""
    return as_backend(backend).get_server_info()


def flush_cache(backend: BackendArg = None) -> bool:
    """Drops the backend's cached prefixes that are not in use (default backend if none given)."""
    return as_backend(backend).flush_cache()
