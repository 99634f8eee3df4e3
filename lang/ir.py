"""The program IR: plain dataclasses that describe a program and round-trip through JSON.

Eager and traced programs share the nodes: `gen(...)` returns a `Gen`, `s += "x"` appends a `Text`.
A traced program (`ProgramIR`, in ir_json.py with its JSON codec) is the flat list of ops the program's states received, in the order
its Python code issued them. State 0 is the program's own state; `Fork` creates states, `Join` merges
them back; `Arg` and `Var` stand for an argument and a variable whose values are known only at run time.
"""
from __future__ import annotations

import base64
from dataclasses import Field, dataclass
from typing import Any, ClassVar

import xxhash

from .choices import ChoiceMethod
from .config import REGEX_BOOL, REGEX_FLOAT, REGEX_INT, REGEX_STR  # noqa: F401 - SGLang's sglang.lang.ir names
from .gen_params import GenParams

IR_VERSION = 2  # the newest version this radixlang reads and writes; it reads every older one too
OP_SINCE = {"separate_reasoning": 2}  # ops added after version 1, with the version that added them
CHOICE_METHODS = ("token_length_normalized", "greedy_token_selection", "unconditional_likelihood_normalized")
JOIN_MODES = ("gather_variable", "concate_and_append")
ROLES = ("system", "user", "assistant")


class TraceError(RuntimeError):
    """Tracing met Python that needs a value only a run has (a generated variable, an unbound argument)."""


class Placeholder:
    """A value unknown while tracing (an argument, a generated variable)."""

    __slots__ = ()

    def describe(self) -> str:
        raise NotImplementedError

    def as_choices(self) -> Arg:
        """The node a select's choices become (an argument's; TraceError if no Arg can stand for it)."""
        raise NotImplementedError

    def as_image(self) -> Arg:
        """The node an image() becomes (an argument's; TraceError if no Arg can stand for it)."""
        raise NotImplementedError


class Node:
    """Something a program appends to its state; `+` chains nodes and strings into a `Seq`."""

    __slots__ = ()
    kind: ClassVar[str] = ""
    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # each node is a dataclass (ir_json reads its fields)

    def __add__(self, other: Appendable) -> "Seq":
        return Seq(_items(self) + _items(other))

    def __radd__(self, other: Appendable) -> "Seq":
        return Seq(_items(other) + _items(self))


Appendable = str | Node | Placeholder  # what `s += x` takes and `+` chains (a Seq is a Node)


def _items(x: object) -> list[Appendable]:
    if isinstance(x, Seq):
        return list(x.nodes)
    if isinstance(x, (str, Node, Placeholder)):
        return [x]
    raise TypeError(f"can only chain strings and program primitives, got {type(x).__name__}")


@dataclass(slots=True)
class Seq(Node):
    """Several items appended in order (eager only: the IR stores them flattened)."""

    nodes: list[Appendable]
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
class Gen(Node):
    name: str | None
    params: GenParams
    kind: ClassVar[str] = "gen"


@dataclass(slots=True)
class Select(Node):
    """Append the most likely of `choices`; `method` names a choice method (eager runs may pass an object)."""

    name: str | None
    choices: list[str] | Arg
    method: str | ChoiceMethod = "token_length_normalized"
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
            assert size is not None, "raw pixels come with their size"
            h.update(f"{mode}:{size[0]}x{size[1]}:".encode())
        h.update(data)
        return h.hexdigest()

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "data": base64.b64encode(self.data).decode(), "hash": self.hash,
                "mode": self.mode, "size": self.size}

    @classmethod
    def from_dict(cls, d: object, where: str) -> "ImageData":
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


@dataclass(slots=True)
class SeparateReasoning(Node):
    """SGLang's separate_reasoning: each variable of `names` keeps the answer, `<name>_reasoning_content` gets
    the reasoning written before it (per `model_type`'s format, lang/reasoning.py), and the state's text keeps
    the answer where the variable's text was."""

    names: list[str]
    model_type: str
    kind: ClassVar[str] = "separate_reasoning"


OP_NODES: dict[str, type[Node]] = {cls.kind: cls for cls in (
    Text, Arg, Var, Gen, Select, RoleBegin, RoleEnd, Image, VarScopeBegin, VarScopeEnd, SetVar, Fork, Join,
    SeparateReasoning)}


def check_select(node: Select, where: str = "select") -> None:
    if not isinstance(node.choices, Arg):
        check_choices(node.choices, where)
    if isinstance(node.method, str) and node.method not in CHOICE_METHODS:
        raise ValueError(f"{where}: choice method must be one of {CHOICE_METHODS}, got {node.method!r}")
    if node.temperature != 0:
        raise ValueError(f"{where}: select scores choices greedily; temperature must be 0, got {node.temperature}")


def check_choices(choices: object, where: str = "select") -> list[str]:
    if isinstance(choices, str) or not isinstance(choices, (list, tuple)) or not choices:
        raise ValueError(f"{where}: choices must be a non-empty list of strings, got {choices!r}")
    if not all(isinstance(c, str) and c for c in choices):
        raise ValueError(f"{where}: every choice must be a non-empty string, got {list(choices)!r}")
    return list(choices)
