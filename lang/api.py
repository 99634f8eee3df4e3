"""The primitives a program appends (SGLang's names): gen, select, image, roles."""
from __future__ import annotations

import json
from typing import Any

from .choices import method_key, token_length_normalized
from .default_backend import as_backend
from .images import load_image
from .gen_params import GEN_FIELDS, GenParams, stop_list
from .ir import (Gen, Image, Placeholder, RoleBegin, RoleEnd, Select, Seq, TraceError, check_select,
                 check_choices)

_DTYPES = {int: "int", float: "float", bool: "bool", str: "str"}


def gen(name: str | None = None, *, max_tokens: int | None = None, min_tokens: int | None = None,
        stop: str | list[str] | None = None, stop_token_ids: list[int] | None = None,
        temperature: float | None = None, top_p: float | None = None, top_k: int | None = None,
        min_p: float | None = None, frequency_penalty: float | None = None,
        presence_penalty: float | None = None, ignore_eos: bool | None = None,
        return_logprob: bool | None = None, top_logprobs_num: int | None = None,
        return_text_in_logprobs: bool | None = None, dtype: type | str | None = None,
        choices: list[str] | None = None, choices_method: Any = None, regex: str | None = None,
        json_schema: str | dict | type | None = None, grammar: str | None = None) -> Gen | Select:
    """Generate text into variable `name`. Unset fields inherit the run's defaults.

    dtype (int, float, bool, str) constrains the output with a regex; regex / json_schema / grammar
    constrain it directly; choices makes this a `select`. The variable holds the generated text.
    """
    fields = {k: v for k, v in locals().items() if k in GEN_FIELDS}  # first line: locals() are the arguments
    for field, value in fields.items():
        _concrete("gen", field, value)
    _check_var_name(name)
    if choices is not None:
        return select(name, choices, temperature=temperature or 0.0,
                      choices_method=choices_method or token_length_normalized)
    fields["stop"] = stop_list(stop)
    fields["dtype"] = _DTYPES.get(dtype, dtype) if isinstance(dtype, type) else dtype
    fields["json_schema"] = _schema_text(json_schema)
    params = GenParams(**fields)
    params.validate()
    return Gen(name, params)


def gen_int(name: str | None = None, **kwargs: Any) -> Gen:
    """gen(name, dtype=int, ...): an integer."""
    return gen(name, dtype=int, **kwargs)


def gen_string(name: str | None = None, **kwargs: Any) -> Gen:
    """gen(name, dtype=str, ...): a double-quoted string."""
    return gen(name, dtype=str, **kwargs)


def select(name: str | None = None, choices: list[str] | None = None, temperature: float = 0.0,
           choices_method: Any = token_length_normalized) -> Select:
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


def image(source: Any) -> Image:
    """An image (a file path, bytes or a PIL image) at this point of the program."""
    if isinstance(source, Placeholder):
        return Image(source.as_image())
    return Image(load_image(source))


def _role(role: str, expr: Any) -> Seq:
    inner = [] if expr is None else [expr]
    return Seq([RoleBegin(role), *inner, RoleEnd(role)])


def system(expr: Any = None) -> Seq:
    return _role("system", expr)


def user(expr: Any = None) -> Seq:
    return _role("user", expr)


def assistant(expr: Any = None) -> Seq:
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


def _concrete(primitive: str, field: str, value: Any) -> None:
    values = value if isinstance(value, (list, tuple)) else [value]
    for v in values:
        if isinstance(v, Placeholder):
            raise TraceError(f"{primitive}'s {field} depends on {v.describe()}, which is unknown while tracing; "
                             "the program still runs eagerly with .run()")


def _check_var_name(name: Any) -> None:
    if isinstance(name, Placeholder):
        raise TraceError(f"a variable name depends on {name.describe()}, which is unknown while tracing")
    if name is not None and (not isinstance(name, str) or not name):
        raise ValueError(f"a variable name must be a non-empty string or None, got {name!r}")


def _schema_text(schema: Any) -> str | None:
    """json_schema as a JSON string, from a string, a dict, or a pydantic model class."""
    if schema is None or isinstance(schema, str):
        return schema
    if isinstance(schema, dict):
        return json.dumps(schema)
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        return json.dumps(schema.model_json_schema())
    raise TypeError(f"json_schema must be a JSON string, a dict or a pydantic model class, got {type(schema).__name__}")


def flush_cache(backend: Any = None) -> bool:
    """Drops the backend's cached prefixes that are not in use (default backend if none given)."""
    return as_backend(backend).flush_cache()
