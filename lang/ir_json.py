"""A traced program (`ProgramIR`: its states' ops) and its JSON form: encoding, decoding of untrusted
input (every field type-checked), and the semantic checks that types cannot express. The node types
are in ir.py, which imports nothing of this module."""
from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass
from typing import Any

from .choices import ChoiceMethod
from .config import MAX_FORK_SIZE
from .gen_params import GenParams
from .ir import (
    CHOICE_METHODS,
    IR_VERSION,
    JOIN_MODES,
    OP_NODES,
    OP_SINCE,
    ROLES,
    Arg,
    Fork,
    Gen,
    Image,
    ImageData,
    Join,
    Node,
    RoleBegin,
    RoleEnd,
    Select,
    SeparateReasoning,
    Seq,
    Var,
    check_select,
)
from .reasoning import reasoning_format


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

    @property
    def version(self) -> int:
        """The oldest IR version that has every op: what the program is written as, so that servers older
        than an op it does not use still read it."""
        return max((OP_SINCE.get(op.node.kind, 1) for op in self.ops), default=1)

    def to_dict(self) -> dict[str, Any]:
        return encode_program(self)

    def to_json(self, **json_kwargs: Any) -> str:  # noqa: ANN401 - json.dumps's own options (indent, ...), passed on
        return json.dumps(self.to_dict(), ensure_ascii=False, **json_kwargs)

    @classmethod
    def from_dict(cls, d: object) -> "ProgramIR":
        """Decodes and validates untrusted input; errors name the offending op and field."""
        return decode_program(d)

    @classmethod
    def from_json(cls, text: str | bytes) -> "ProgramIR":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"IR program is not valid JSON: {e}") from None
        return cls.from_dict(data)

    def validate(self) -> None:
        """Checks what types cannot: states exist before use, forks and joins pair up, params are valid."""
        validate_program(self)


def encode_program(program: ProgramIR) -> dict[str, Any]:
    return {"version": program.version, "name": program.name, "params": list(program.params),
            "ops": [{"state": op.state, **_encode_node(op.node)} for op in program.ops]}


def decode_program(d: object) -> ProgramIR:
    if not isinstance(d, dict):
        raise ValueError("an IR program must be a JSON object")
    version = d.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= IR_VERSION:
        raise ValueError(f"unsupported IR version {version!r}; this radixlang reads versions 1 to {IR_VERSION}")
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
        node = _decode_node(raw, f"ops[{i}]")
        if OP_SINCE.get(node.kind, 1) > version:
            raise ValueError(f"ops[{i}]: op {node.kind!r} is not in IR version {version}; "
                             f"it needs version {OP_SINCE[node.kind]}")
        ops.append(Op(state, node))
    program = ProgramIR(name, params, ops)
    validate_program(program)
    return program


def validate_program(program: ProgramIR) -> None:
    _Validator(program).run()


def _encode_node(node: Node) -> dict[str, object]:
    if isinstance(node, Seq):
        raise ValueError("a Seq is flattened before it enters the IR")
    out: dict[str, object] = {"op": node.kind}
    for f in dataclasses.fields(node):
        out[f.name] = _encode(getattr(node, f.name))
    if isinstance(node, Select) and not isinstance(node.method, str):
        raise ValueError(f"select {node.name!r} uses a custom choice method, which the IR cannot store; "
                         f"use one of {CHOICE_METHODS}")
    return out


def _encode(value: object) -> object:
    """A field's value as JSON."""
    if isinstance(value, Node):
        return _encode_node(value)
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


# types a field holds only in an eager run: the JSON form carries a name instead (Select.method)
_RUN_ONLY = (ChoiceMethod,)


def _coerce(value: object, hint: object,
            where: str) -> Any:  # noqa: ANN401 - a value of the type `hint` names, checked here at run time
    """`value` (decoded JSON) checked against the type `hint`; raises ValueError naming `where`."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        errors = []
        for option in (o for o in typing.get_args(hint) if o not in _RUN_ONLY):
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
    if isinstance(hint, type) and hint in (bool, str):
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
            check_select(node, where)
        elif isinstance(node, (RoleBegin, RoleEnd)) and node.role not in ROLES:
            raise ValueError(f"{where}: role must be one of {ROLES}, got {node.role!r}")
        elif isinstance(node, SeparateReasoning):
            try:
                reasoning_format(node.model_type)
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
            if not all(isinstance(n, str) and n for n in node.names):
                raise ValueError(f"{where}: names must be non-empty strings, got {node.names!r}")
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
