"""The program IR: plain dataclasses that describe a program and round-trip through JSON.

Eager and traced programs share the nodes: `gen(...)` returns a `Gen`, `s += "x"` appends a `Text`.
A traced program (`ProgramIR`) is the flat list of ops the program's states received, in the order
its Python code issued them. State 0 is the program's own state; `Fork` creates states, `Join` merges
them back; `Arg` and `Var` stand for an argument and a variable whose values are known only at run time.
"""
from __future__ import annotations

import base64
import dataclasses
import json
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, ClassVar

import xxhash

from ..runtime.config import DTYPE_REGEXES, MAX_FORK_SIZE

IR_VERSION = 1
CHOICE_METHODS = ("token_length_normalized", "greedy_token_selection", "unconditional_likelihood_normalized")
JOIN_MODES = ("gather_variable", "concate_and_append")
ROLES = ("system", "user", "assistant")
_UNBOUNDED = 2**62  # stands in for limits only the backend knows (context length, vocabulary size)
_LANG_NAMES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}


class TraceError(RuntimeError):
    """Tracing met Python that needs a value only a run has (a generated variable, an unbound argument)."""


class Placeholder:
    """A value unknown while tracing (an argument, a generated variable)."""

    __slots__ = ()

    def describe(self) -> str:
        raise NotImplementedError


class Node:
    """Something a program appends to its state; `+` chains nodes and strings into a `Seq`."""

    __slots__ = ()
    kind: ClassVar[str] = ""

    def __add__(self, other: Any) -> "Seq":
        return Seq(_items(self) + _items(other))

    def __radd__(self, other: Any) -> "Seq":
        return Seq(_items(other) + _items(self))


def _items(x: Any) -> list[Any]:
    if isinstance(x, Seq):
        return list(x.nodes)
    if isinstance(x, (str, Node, Placeholder)):
        return [x]
    raise TypeError(f"can only chain strings and program primitives, got {type(x).__name__}")


@dataclass(slots=True)
class Seq(Node):
    """Several items appended in order (eager only: the IR stores them flattened)."""

    nodes: list[Any]
    kind: ClassVar[str] = "seq"


@dataclass(slots=True)
class Text(Node):
    value: str
    kind: ClassVar[str] = "text"


@dataclass(slots=True)
class Arg(Node):
    """The value of the program argument `name` (text, an image, or a select's choices)."""

    name: str
    kind: ClassVar[str] = "arg"


@dataclass(slots=True)
class Var(Node):
    """The text of variable `name` of state `source`."""

    name: str
    source: int = 0
    kind: ClassVar[str] = "var"


@dataclass(slots=True)
class GenParams:
    """gen()'s sampling fields (SGLang's names); None: inherit the run's default, then the backend's."""

    max_tokens: int | None = None
    min_tokens: int | None = None
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    ignore_eos: bool | None = None
    return_logprob: bool | None = None
    top_logprobs_num: int | None = None
    return_text_in_logprobs: bool | None = None
    dtype: str | None = None
    regex: str | None = None
    json_schema: str | None = None
    grammar: str | None = None

    _REQUEST_FIELDS: ClassVar[tuple[str, ...]] = ("return_logprob", "top_logprobs_num", "return_text_in_logprobs")
    _CONSTRAINTS: ClassVar[tuple[str, ...]] = ("dtype", "regex", "json_schema", "grammar")

    def merged(self, defaults: "GenParams") -> "GenParams":
        """These params, with unset fields taken from `defaults`."""
        return GenParams(**{f.name: v if (v := getattr(self, f.name)) is not None else getattr(defaults, f.name)
                            for f in dataclasses.fields(self)})

    def set_fields(self) -> dict[str, Any]:
        return {f.name: v for f in dataclasses.fields(self) if (v := getattr(self, f.name)) is not None}

    def sampling_params(self) -> dict[str, Any]:
        """The backend's `sampling_params` (runtime names); dtype becomes its regex."""
        out: dict[str, Any] = {}
        for name, value in self.set_fields().items():
            if name in self._REQUEST_FIELDS:
                continue
            if name == "dtype":
                out["regex"] = DTYPE_REGEXES[value]
            elif name == "max_tokens":
                out["max_new_tokens"] = value
            elif name == "min_tokens":
                out["min_new_tokens"] = value
            else:
                out[name] = value
        return out

    def validate(self) -> None:
        """Checks each set field's type and range (limits that depend on the model are the backend's)."""
        from ..runtime.sampling_params import SamplingParams

        constraints = [n for n in self._CONSTRAINTS if getattr(self, n) is not None]
        if len(constraints) > 1:
            raise ValueError(f"gen takes at most one of dtype, regex, json_schema and grammar, got {constraints}")
        self._validate_constraint()
        for name in ("return_logprob", "return_text_in_logprobs"):
            if getattr(self, name) not in (None, True, False):
                raise ValueError(f"{name} must be a boolean, got {getattr(self, name)!r}")
        n = self.top_logprobs_num
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 0):
            raise ValueError(f"top_logprobs_num must be an integer >= 0, got {n!r}")
        fields = {k: v for k, v in self.sampling_params().items() if k not in ("regex", "json_schema", "grammar")}
        if "min_new_tokens" in fields:
            fields.setdefault("max_new_tokens", _UNBOUNDED)  # the run's default is not known here
        try:
            SamplingParams.from_any(fields).validate(vocab_size=_UNBOUNDED, context_length=_UNBOUNDED)
        except ValueError as e:
            message = str(e).replace(f", {_UNBOUNDED}]", "]").replace(f" [0, {_UNBOUNDED})", "")
            for runtime_name, lang_name in _LANG_NAMES.items():
                message = message.replace(runtime_name, lang_name)
            raise ValueError(message) from None
        if self.stop is not None and (not isinstance(self.stop, list) or not self.stop):
            raise ValueError(f"stop must be a non-empty string or a non-empty list of them, got {self.stop!r}")

    def _validate_constraint(self) -> None:
        if self.dtype is not None and self.dtype not in DTYPE_REGEXES:
            raise ValueError(f"dtype must be one of {sorted(DTYPE_REGEXES)} (or int, float, bool, str), "
                             f"got {self.dtype!r}")
        if self.regex is not None:
            if not isinstance(self.regex, str) or not self.regex:
                raise ValueError(f"regex must be a non-empty string, got {self.regex!r}")
            try:
                re.compile(self.regex)
            except re.error as e:
                raise ValueError(f"regex {self.regex!r} is not a valid regular expression: {e}") from None
        if self.json_schema is not None:
            if not isinstance(self.json_schema, str):
                raise ValueError("json_schema must be a JSON string (gen() also takes a dict or pydantic model)")
            try:
                schema = json.loads(self.json_schema)
            except json.JSONDecodeError as e:
                raise ValueError(f"json_schema is not valid JSON: {e}") from None
            if not isinstance(schema, (dict, bool)):
                raise ValueError("json_schema must be a JSON object")
        if self.grammar is not None and (not isinstance(self.grammar, str) or not self.grammar.strip()):
            raise ValueError(f"grammar must be a non-empty Lark grammar string, got {self.grammar!r}")


@dataclass(slots=True)
class Gen(Node):
    name: str | None
    params: GenParams
    kind: ClassVar[str] = "gen"


@dataclass(slots=True)
class Select(Node):
    """Append the most likely of `choices`; `method` names a choice method (eager runs may pass an object)."""

    name: str | None
    choices: list[str] | Arg
    method: str = "token_length_normalized"
    temperature: float = 0.0
    kind: ClassVar[str] = "select"


@dataclass(slots=True)
class RoleBegin(Node):
    role: str
    kind: ClassVar[str] = "role_begin"


@dataclass(slots=True)
class RoleEnd(Node):
    role: str
    kind: ClassVar[str] = "role_end"


@dataclass(slots=True)
class ImageData:
    """An image's bytes: `encoded` (a file's bytes) or `pixels` (raw, with mode and size)."""

    kind: str
    data: bytes
    hash: str  # xxh3_128 hex digest; names the image
    mode: str | None = None
    size: list[int] | None = None

    @staticmethod
    def digest(kind: str, data: bytes, mode: str | None, size: list[int] | None) -> str:
        h = xxhash.xxh3_128()
        if kind == "pixels":  # the same pixels in another layout are another image
            h.update(f"{mode}:{size[0]}x{size[1]}:".encode())
        h.update(data)
        return h.hexdigest()

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "data": base64.b64encode(self.data).decode(), "hash": self.hash,
                "mode": self.mode, "size": self.size}

    @classmethod
    def from_dict(cls, d: Any, where: str) -> "ImageData":
        if not isinstance(d, dict) or set(d) - {"kind", "data", "hash", "mode", "size"}:
            raise ValueError(f"{where}: an image needs kind, data, hash, mode, size")
        kind, mode, size = d.get("kind"), d.get("mode"), d.get("size")
        if kind not in ("encoded", "pixels"):
            raise ValueError(f"{where}.kind must be 'encoded' or 'pixels', got {kind!r}")
        if kind == "pixels" and not (isinstance(mode, str) and isinstance(size, list) and len(size) == 2
                                     and all(isinstance(x, int) and x > 0 for x in size)):
            raise ValueError(f"{where}: pixel images need a mode and a [width, height] size")
        try:
            data = base64.b64decode(d.get("data", ""), validate=True)
        except (ValueError, TypeError):
            raise ValueError(f"{where}.data must be base64") from None
        image = cls(kind, data, cls.digest(kind, data, mode, size), mode, size)
        if d.get("hash") != image.hash:
            raise ValueError(f"{where}.hash does not match the image data")
        return image


@dataclass(slots=True)
class Image(Node):
    source: ImageData | Arg
    kind: ClassVar[str] = "image"


@dataclass(slots=True)
class VarScopeBegin(Node):
    name: str
    kind: ClassVar[str] = "var_scope_begin"


@dataclass(slots=True)
class VarScopeEnd(Node):
    name: str
    kind: ClassVar[str] = "var_scope_end"


@dataclass(slots=True)
class SetVar(Node):
    name: str
    value: Any  # JSON
    kind: ClassVar[str] = "set_var"


@dataclass(slots=True)
class Fork(Node):
    """Create states `children`, each a copy of this one."""

    size: int
    children: list[int]
    kind: ClassVar[str] = "fork"


@dataclass(slots=True)
class Join(Node):
    """Merge the states of one fork back: gather their variables, or append their text."""

    children: list[int]
    mode: str = "gather_variable"
    kind: ClassVar[str] = "join"


OP_NODES: dict[str, type[Node]] = {cls.kind: cls for cls in (
    Text, Arg, Var, Gen, Select, RoleBegin, RoleEnd, Image, VarScopeBegin, VarScopeEnd, SetVar, Fork, Join)}


@dataclass(slots=True)
class Op:
    state: int
    node: Node


@dataclass(slots=True)
class ProgramIR:
    """A traced program: its argument names and the ops its states receive."""

    name: str
    params: list[str]
    ops: list[Op]
    version: int = IR_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "name": self.name, "params": list(self.params),
                "ops": [{"state": op.state, **_encode(op.node)} for op in self.ops]}

    def to_json(self, **json_kwargs: Any) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, **json_kwargs)

    @classmethod
    def from_dict(cls, d: Any) -> "ProgramIR":
        """Decodes and validates untrusted input; errors name the offending op and field."""
        if not isinstance(d, dict):
            raise ValueError("an IR program must be a JSON object")
        if d.get("version") != IR_VERSION:
            raise ValueError(f"unsupported IR version {d.get('version')!r}; this radixlang reads version {IR_VERSION}")
        unknown = set(d) - {"version", "name", "params", "ops"}
        if unknown:
            raise ValueError(f"unknown IR field(s) {sorted(unknown)}")
        name = _coerce(d.get("name", ""), str, "name")
        params = _coerce(d.get("params", []), list[str], "params")
        raw_ops = d.get("ops")
        if not isinstance(raw_ops, list):
            raise ValueError("ops must be a list")
        ops = []
        for i, raw in enumerate(raw_ops):
            if not isinstance(raw, dict):
                raise ValueError(f"ops[{i}] must be an object")
            raw = dict(raw)
            state = _coerce(raw.pop("state", None), int, f"ops[{i}].state")
            ops.append(Op(state, _decode_node(raw, f"ops[{i}]")))
        program = cls(name, params, ops)
        program.validate()
        return program

    @classmethod
    def from_json(cls, text: str | bytes) -> "ProgramIR":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"IR program is not valid JSON: {e}") from None
        return cls.from_dict(data)

    def validate(self) -> None:
        _Validator(self).run()


# ---- JSON encoding --------------------------------------------------------------------------------
def _encode(value: Any) -> Any:
    if isinstance(value, Seq):
        raise ValueError("a Seq is flattened before it enters the IR")
    if isinstance(value, Node):
        out = {"op": value.kind}
        for f in dataclasses.fields(value):
            out[f.name] = _encode(getattr(value, f.name))
        if isinstance(value, Select) and not isinstance(value.method, str):
            raise ValueError(f"select {value.name!r} uses a custom choice method, which the IR cannot store; "
                             f"use one of {CHOICE_METHODS}")
        return out
    if isinstance(value, GenParams):
        return value.set_fields()
    if isinstance(value, ImageData):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [_encode(x) for x in value]
    return value


def _decode_node(d: dict[str, Any], where: str, allowed: tuple[type[Node], ...] | None = None) -> Node:
    kind = d.get("op")
    cls = OP_NODES.get(kind) if isinstance(kind, str) else None
    if cls is None or (allowed is not None and cls not in allowed):
        names = sorted(OP_NODES) if allowed is None else [c.kind for c in allowed]
        raise ValueError(f"{where}.op must be one of {names}, got {kind!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(d) - set(fields) - {"op"}
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {sorted(unknown)} for op {kind!r}")
    values = {}
    for name, f in fields.items():
        if name not in d:
            if f.default is dataclasses.MISSING:
                raise ValueError(f"{where}: op {kind!r} needs field {name!r}")
            continue
        values[name] = _coerce(d[name], hints[name], f"{where}.{name}")
    return cls(**values)


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """`value` (decoded JSON) checked against the type `hint`; raises ValueError naming `where`."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        errors = []
        for option in typing.get_args(hint):
            try:
                return _coerce(value, option, where)
            except ValueError as e:
                errors.append(str(e))
        raise ValueError(errors[-1] if len(errors) == 1 else f"{where} has the wrong type: {'; '.join(errors)}")
    if origin is list:
        if not isinstance(value, list):
            raise ValueError(f"{where} must be a list, got {type(value).__name__}")
        (item,) = typing.get_args(hint)
        return [_coerce(x, item, f"{where}[{i}]") for i, x in enumerate(value)]
    if hint is type(None):
        if value is not None:
            raise ValueError(f"{where} must be null")
        return None
    if hint is bool or hint is str:
        if not isinstance(value, hint):
            raise ValueError(f"{where} must be a {hint.__name__}, got {value!r}")
        return value
    if hint is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{where} must be an integer, got {value!r}")
        return value
    if hint is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ValueError(f"{where} must be a number, got {value!r}")
        return float(value)
    if hint is ImageData:
        return ImageData.from_dict(value, where)
    if hint is GenParams:
        if not isinstance(value, dict):
            raise ValueError(f"{where} must be an object")
        gen_hints = typing.get_type_hints(GenParams)
        unknown = set(value) - {f.name for f in dataclasses.fields(GenParams)}
        if unknown:
            raise ValueError(f"{where}: unknown gen field(s) {sorted(unknown)}")
        return GenParams(**{k: _coerce(v, gen_hints[k], f"{where}.{k}") for k, v in value.items()})
    if isinstance(hint, type) and issubclass(hint, Node):
        if not isinstance(value, dict):
            raise ValueError(f"{where} must be an object")
        return _decode_node(value, where, (hint,))
    raise AssertionError(f"no decoder for {hint!r}")


# ---- semantic checks --------------------------------------------------------------------------------
class _Validator:
    """Checks what types cannot: states exist before use, forks and joins pair up, params are valid."""

    def __init__(self, program: ProgramIR):
        self.program = program
        self.live = {0}  # states that may receive ops
        self.known = {0}  # every state created so far
        self.forks: dict[tuple[int, ...], int] = {}  # a fork's children -> its parent

    def run(self) -> None:
        p = self.program
        if p.version != IR_VERSION:
            raise ValueError(f"unsupported IR version {p.version}; this radixlang reads version {IR_VERSION}")
        if len(set(p.params)) != len(p.params) or not all(s.isidentifier() for s in p.params):
            raise ValueError(f"params must be distinct identifiers, got {p.params}")
        for i, op in enumerate(p.ops):
            where = f"ops[{i}] ({op.node.kind})"
            if op.state not in self.live:
                raise ValueError(f"{where}: state {op.state} does not exist here (never forked, or already joined)")
            self._check(op, where)

    def _check(self, op: Op, where: str) -> None:
        node = op.node
        if isinstance(node, Seq) or not isinstance(node, Node):
            raise ValueError(f"{where}: not an IR op")
        for arg in _args_of(node):
            if arg.name not in self.program.params:
                raise ValueError(f"{where}: argument {arg.name!r} is not in params {self.program.params}")
        if isinstance(node, Var) and node.source not in self.known:
            raise ValueError(f"{where}: variable source state {node.source} does not exist")
        elif isinstance(node, Gen):
            node.params.validate()
        elif isinstance(node, Select):
            _check_select(node, where)
        elif isinstance(node, (RoleBegin, RoleEnd)) and node.role not in ROLES:
            raise ValueError(f"{where}: role must be one of {ROLES}, got {node.role!r}")
        elif isinstance(node, Fork):
            self._fork(op.state, node, where)
        elif isinstance(node, Join):
            self._join(op.state, node, where)

    def _fork(self, parent: int, node: Fork, where: str) -> None:
        if not 1 <= node.size <= MAX_FORK_SIZE or len(node.children) != node.size:
            raise ValueError(f"{where}: size must be in [1, {MAX_FORK_SIZE}] and match the children")
        if len(set(node.children)) != node.size or self.known & set(node.children):
            raise ValueError(f"{where}: children must be new, distinct state ids")
        self.known |= set(node.children)
        self.live |= set(node.children)
        self.forks[tuple(node.children)] = parent

    def _join(self, parent: int, node: Join, where: str) -> None:
        if self.forks.get(tuple(node.children)) != parent:
            raise ValueError(f"{where}: children {node.children} are not one fork of state {parent}")
        if node.mode not in JOIN_MODES:
            raise ValueError(f"{where}: mode must be one of {JOIN_MODES}, got {node.mode!r}")
        if not set(node.children) <= self.live:
            raise ValueError(f"{where}: children {node.children} were already joined")
        self.live -= set(node.children)


def _args_of(node: Node) -> list[Arg]:
    if isinstance(node, Arg):
        return [node]
    if isinstance(node, Select) and isinstance(node.choices, Arg):
        return [node.choices]
    if isinstance(node, Image) and isinstance(node.source, Arg):
        return [node.source]
    return []


def _check_select(node: Select, where: str = "select") -> None:
    if not isinstance(node.choices, Arg):
        check_choices(node.choices, where)
    if isinstance(node.method, str) and node.method not in CHOICE_METHODS:
        raise ValueError(f"{where}: choice method must be one of {CHOICE_METHODS}, got {node.method!r}")
    if node.temperature != 0:
        raise ValueError(f"{where}: select scores choices greedily; temperature must be 0, got {node.temperature}")


def check_choices(choices: Any, where: str = "select") -> list[str]:
    if isinstance(choices, str) or not isinstance(choices, (list, tuple)) or not choices:
        raise ValueError(f"{where}: choices must be a non-empty list of strings, got {choices!r}")
    if not all(isinstance(c, str) and c for c in choices):
        raise ValueError(f"{where}: every choice must be a non-empty string, got {list(choices)!r}")
    return list(choices)
