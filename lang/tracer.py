"""The tracer: runs a program's Python once with placeholders and records what it appends as IR.

Unbound arguments and generated variables become placeholders. Inserting one into text (`+`,
f-strings, `str()`) works: the text carries a marker that becomes an `Arg` / `Var` op. Using the
value itself (`if`, `==`, `len`, `int()`, string methods) raises TraceError, because a trace cannot
follow Python control flow that depends on generated values; such a program still runs eagerly.
String operations on `str(placeholder)` that cut or recase the marker are detected too; the tracer
cannot see other uses of that string (its length, say), so keep such code out of traced programs.
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import re
from typing import Any, Callable, Iterator, NoReturn, Protocol

from .executor import variables_set_by
from .ir import (
    Appendable,
    Arg,
    Fork,
    Image,
    Join,
    Node,
    Placeholder,
    RoleBegin,
    RoleEnd,
    Select,
    Seq,
    SetVar,
    Text,
    TraceError,
    Var,
)
from .ir_json import Op, ProgramIR
from .state import ProgramStateGroup, StateOps, _check_name, check_fork_size


class Traceable(Protocol):
    """What tracing reads of a program (lang/program.Program)."""

    func: Callable[..., Any]
    signature: inspect.Signature
    state_param: str  # the name of the function's first parameter, the state
    arg_names: list[str]
    bind_arguments: dict[str, Any]
    name: str

# A marker's tag mixes cases, so upper(), lower(), title() and friends break it detectably.
_MARKER = re.compile("\ue000([^\ue001]*)\ue001")
_CONSTANT_PREFIX_NODES = (Text, RoleBegin, RoleEnd)


class _PrefixEnd(BaseException):  # not an Exception, so a program's `except Exception` lets it through
    """Stops a prefix-only trace at its first non-constant op."""


class _Trace:
    def __init__(self, prefix_only: bool = False):
        self.ops: list[Op] = []
        self.placeholders: list[_Value] = []
        self.next_state = 1
        self.live = {0}
        self.defined: dict[int, set[str]] = {0: set()}
        self.assigned: dict[int, list[str]] = {0: []}
        self.prefix_only = prefix_only

    def marker(self, value: "_Value") -> str:
        if value.index is None:
            value.index = len(self.placeholders)
            self.placeholders.append(value)
        return f"\ue000rL{value.index}\ue001"

    def record(self, state: int, node: Node) -> None:
        if state not in self.live:
            raise RuntimeError(f"state {state} has finished (joined) and takes no more input")
        if self.prefix_only and (state != 0 or not isinstance(node, _CONSTANT_PREFIX_NODES)):
            raise _PrefixEnd
        _reject_markers(node)
        if isinstance(node, Select) and not isinstance(node.method, str):
            raise TraceError(f"select {node.name!r} uses a custom choice method, which a traced program cannot "
                             "carry; use a built-in method or run the program eagerly")
        self.ops.append(Op(state, node))
        for name in variables_set_by(node):
            self._assign(state, name)

    def _assign(self, state: int, name: str) -> None:
        self.defined[state].add(name)
        if name not in self.assigned[state]:
            self.assigned[state].append(name)

    def fork(self, parent: int, size: int) -> list[int]:
        children = list(range(self.next_state, self.next_state + size))
        self.record(parent, Fork(size, children))
        self.next_state += size
        for c in children:
            self.live.add(c)
            self.defined[c] = set(self.defined[parent])
            self.assigned[c] = []
        return children

    def join(self, parent: int, children: list[int], mode: str) -> None:
        self.record(parent, Join(children, mode))
        self.live -= set(children)
        if mode == "gather_variable":
            for c in children:
                for name in self.assigned[c]:
                    self._assign(parent, name)

    # ---- turning appended items into ops --------------------------------------------------------
    def nodes(self, item: object) -> list[Node]:
        if isinstance(item, str):
            return self._split(item)
        if isinstance(item, Seq):
            return [n for x in item.nodes for n in self.nodes(x)]
        if isinstance(item, _Value):
            return [item.node()]
        if isinstance(item, Node) and not isinstance(item, (Arg, Var, Fork, Join)):
            return [item]
        raise TypeError(f"cannot append {type(item).__name__} to a program state; append a string or a "
                        "primitive (gen, select, image, a role)")

    def _split(self, text: str) -> list[Node]:
        out: list[Node] = []
        pos = 0
        for m in _MARKER.finditer(text):
            out += self._text(text[pos:m.start()])
            out.append(self._placeholder(m.group(1)).node())
            pos = m.end()
        return out + self._text(text[pos:])

    def _text(self, piece: str) -> list[Node]:
        if "\ue000" in piece or "\ue001" in piece:  # a marker cut apart, e.g. by slicing
            raise self._mangled()
        return [Text(piece)] if piece else []

    def _placeholder(self, tag: str) -> "_Value":
        if not (tag.startswith("rL") and tag[2:].isdigit() and int(tag[2:]) < len(self.placeholders)):
            raise self._mangled()
        return self.placeholders[int(tag[2:])]

    @staticmethod
    def _mangled() -> TraceError:
        return TraceError("a string operation changed a traced value's text (upper(), replace(), slicing...); "
                          "the tracer can only insert arguments and variables as they are")



def _reject_markers(node: Node) -> None:
    """Traced values may be inserted into text, not into a primitive's parameters."""
    if not isinstance(node, (Text, Image)) and _has_marker(node):
        raise TraceError(f"a parameter of {node.kind} depends on a value unknown while tracing; "
                         "the program still runs eagerly with .run()")


def _has_marker(value: object) -> bool:
    if isinstance(value, str):
        return "\ue000" in value
    if isinstance(value, (list, tuple)):
        return any(_has_marker(v) for v in value)
    if isinstance(value, dict):
        return any(_has_marker(k) or _has_marker(v) for k, v in value.items())
    if dataclasses.is_dataclass(value):
        return any(_has_marker(getattr(value, f.name)) for f in dataclasses.fields(value))
    return False


class _Value(Placeholder):
    """A placeholder; inserting it into text works, using its value raises TraceError."""

    __slots__ = ("trace", "index")

    def __init__(self, trace: _Trace):
        self.trace = trace
        self.index: int | None = None

    def node(self) -> Node:
        raise NotImplementedError

    def hint(self) -> str:
        raise NotImplementedError

    def _fail(self, what: str) -> TraceError:
        return TraceError(f"{what} needs {self.describe()}, which is unknown while tracing. {self.hint()}")

    def __str__(self) -> str:
        return self.trace.marker(self)

    def __format__(self, spec: str) -> str:
        if spec:
            raise self._fail(f"the format spec {spec!r}")
        return self.trace.marker(self)

    def __add__(self, other: object) -> str | Seq:
        if isinstance(other, str):
            return self.trace.marker(self) + other
        if isinstance(other, (Node, Placeholder)):
            return Seq([self, *(other.nodes if isinstance(other, Seq) else [other])])
        return NotImplemented

    def __radd__(self, other: object) -> str | Seq:
        if isinstance(other, str):
            return other + self.trace.marker(self)
        if isinstance(other, Node):
            return Seq([*(other.nodes if isinstance(other, Seq) else [other]), self])
        return NotImplemented

    def __repr__(self) -> str:
        raise self._fail("repr()")

    def __bool__(self) -> bool:
        raise self._fail("a truth test (if / while / and / or)")

    def __eq__(self, other: object) -> bool:
        raise self._fail("a comparison")

    __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __eq__
    __hash__ = object.__hash__

    def __len__(self) -> int:
        raise self._fail("len()")

    def __iter__(self) -> Iterator[Any]:
        raise self._fail("iteration")

    def __contains__(self, item: object) -> bool:
        raise self._fail("the `in` operator")

    def __getitem__(self, key: object) -> NoReturn:
        raise self._fail("indexing")

    def __int__(self) -> int:
        raise self._fail("int()")

    def __float__(self) -> float:
        raise self._fail("float()")

    def __index__(self) -> int:
        raise self._fail("use as an integer")

    def __getattr__(self, attr: str) -> NoReturn:
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise self._fail(f".{attr}")


class _ArgValue(_Value):
    __slots__ = ("name",)

    def __init__(self, trace: _Trace, name: str):
        super().__init__(trace)
        self.name = name

    def describe(self) -> str:
        return f"argument {self.name!r}"

    def hint(self) -> str:
        return f"Pass a value to trace({self.name}=...) to fix it in the IR."

    def node(self) -> Node:
        return Arg(self.name)

    def as_choices(self) -> Arg:
        return Arg(self.name)

    def as_image(self) -> Arg:
        return Arg(self.name)


class _VarValue(_Value):
    __slots__ = ("name", "source")

    def __init__(self, trace: _Trace, name: str, source: int):
        super().__init__(trace)
        self.name, self.source = name, source

    def describe(self) -> str:
        return f"generated variable {self.name!r}"

    def hint(self) -> str:
        return "Python control flow on generated values cannot be traced; the program still runs eagerly with .run()."

    def node(self) -> Node:
        return Var(self.name, self.source)

    def as_choices(self) -> Arg:
        raise self._fail("select's choices")

    def as_image(self) -> Arg:
        raise self._fail("image()")


class TracingState(StateOps):
    """The `s` a program receives while tracing: it records ops instead of running them."""

    def __init__(self, trace: _Trace, sid: int):
        self._trace, self._sid = trace, sid

    def __iadd__(self, other: Appendable) -> "TracingState":
        for node in self._trace.nodes(other):
            self._trace.record(self._sid, node)
        return self

    def fork(self, size: int = 1) -> ProgramStateGroup[TracingState]:
        check_fork_size(size)
        children = self._trace.fork(self._sid, size)
        return ProgramStateGroup([TracingState(self._trace, c) for c in children], self)

    def _join_fork(self, children: list[TracingState], mode: str) -> None:
        self._trace.join(self._sid, [s._sid for s in children], mode)

    def get_var(self, name: str) -> _VarValue:
        if name not in self._trace.defined[self._sid]:
            raise KeyError(f"variable {name!r} is not defined in this state")
        return _VarValue(self._trace, name, self._sid)

    __getitem__ = get_var

    def __contains__(self, name: str) -> bool:
        return name in self._trace.defined[self._sid]

    def set_var(self, name: str, value: object) -> None:
        _check_name(name)
        try:
            json.dumps(value)
        except TypeError:
            raise TraceError(f"set_var {name!r}: a traced program can only store JSON values") from None
        self += SetVar(name, value)  # noqa: PLW0642

    __setitem__ = set_var

    def _unknown(self, what: str) -> TraceError:
        return TraceError(f"{what} is unknown while tracing; the program still runs eagerly with .run()")

    def text(self) -> str:
        raise self._unknown("the state's text")

    def messages(self) -> list[dict[str, Any]]:
        raise self._unknown("the state's messages")

    def get_meta_info(self, name: str) -> NoReturn:
        raise self._unknown(f"the meta info of {name!r}")

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        raise self._unknown("streamed text")

    def sync(self) -> None:
        return None

    def error(self) -> None:
        return None


def trace_program(program: Traceable, kwargs: dict[str, Any], prefix_only: bool = False) -> ProgramIR:
    """Records `program` as IR. Arguments in `kwargs` (and defaults) are fixed into the IR; the rest
    become its params. With prefix_only, stops at the first op that is not constant text or a role."""
    trace = _Trace(prefix_only)
    state = TracingState(trace, 0)
    values, params = {}, []
    bound = {**program.bind_arguments, **kwargs}
    unknown = sorted(set(bound) - set(program.arg_names))
    if unknown:
        raise TypeError(f"{program.name}() has no argument(s) {unknown}")
    for p in program.signature.parameters.values():
        if p.name == program.state_param or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.name in bound:
            values[p.name] = bound[p.name]
        elif p.default is not inspect.Parameter.empty:
            values[p.name] = p.default
        else:
            values[p.name] = _ArgValue(trace, p.name)
            params.append(p.name)
    call = program.signature.bind(state, **values)
    try:
        program.func(*call.args, **call.kwargs)
    except _PrefixEnd:
        pass
    return ProgramIR(program.name, params, trace.ops)


def constant_prefix(program: Traceable) -> list[Node]:
    """The ops a program always starts with (text and roles before any argument or generation)."""
    try:
        ir = trace_program(program, {}, prefix_only=True)
    except Exception:  # noqa: BLE001 - tracing the prefix is an optimization; the runs surface real errors
        return []
    return [op.node for op in ir.ops]

