"""Program states. Each state runs its ops in order on its own worker thread, so `s += gen(...)`
returns at once, reading a variable waits for it, and the states of a fork run in parallel.

All states of one run share a `_Run`: the backend, the sampling defaults, the chat template and,
for server-side runs, the queue of events that streams the program's progress.
"""
from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, ClassVar, Iterator

from .backend import Backend, StateView
from .chat import ChatTemplate
from .choices import resolve_method
from .ir import (JOIN_MODES, Gen, GenParams, Image, ImageData, Node, Placeholder, RoleBegin, RoleEnd, Select,
                 Seq, SetVar, Text, VarScopeBegin, VarScopeEnd)
from ..runtime.config import MAX_FORK_SIZE


class ProgramCancelled(RuntimeError):
    """The run was cancelled (its event consumer went away) before this op ran."""


@dataclass(slots=True)
class ProgramEvent:
    """Progress of a run: `text` (a delta of state `state`), `var` (a variable was set),
    then exactly one of `end` (value: the final text, variables and messages) or `error`."""

    kind: str
    state: int = 0
    name: str | None = None
    value: Any = None
    meta: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"event": self.kind, "state": self.state}
        if self.kind == "text":
            out["delta"] = self.value
        elif self.kind == "var":
            out.update(name=self.name, value=self.value, meta=self.meta)
        elif self.kind == "end":
            out.update(self.value)
        else:
            out.update(error=str(self.value), type=type(self.value).__name__)
        return out


@dataclass(slots=True)
class _JoinOp(Node):
    """Merges a finished fork into its parent (internal: built by ProgramStateGroup.join)."""

    mode: str
    values: dict[str, list[Any]]
    metas: dict[str, list[Any]]
    text: str
    kind: ClassVar[str] = "_join"


_EAGER_NODES = (Text, Gen, Select, RoleBegin, RoleEnd, Image, VarScopeBegin, VarScopeEnd, SetVar)


class _Run:
    """What the states of one program run share."""

    def __init__(self, backend: Backend | None, defaults: GenParams, events: queue.Queue | None = None):
        self.backend = backend
        self.defaults = defaults
        self.events = events
        self.lock = threading.Lock()
        self.cores: list[_Core] = []
        self.next_id = 0
        self.done = threading.Event()  # the program returned and every state drained
        self.cancelled = threading.Event()
        self.program_thread: threading.Thread | None = None
        self.program_error: BaseException | None = None
        self.ret_value: Any = None
        self._template: ChatTemplate | None = None
        self._template_fetched = False

    def new_core(self, parent: "_Core | None", sid: int | None = None) -> "_Core":
        with self.lock:
            if sid is None:
                sid = self.next_id
            self.next_id = max(self.next_id, sid + 1)
            core = _Core(self, sid, parent)
            self.cores.append(core)
        return core

    def template(self) -> ChatTemplate:
        with self.lock:
            if not self._template_fetched:
                self._template = self.backend.chat_template() if self.backend is not None else None
                self._template_fetched = True
        if self._template is None:
            raise ValueError("the model has no chat template, so roles (system/user/assistant) cannot be rendered")
        return self._template

    def emit(self, event: ProgramEvent) -> None:
        if self.events is not None:
            self.events.put(event)

    @property
    def error(self) -> BaseException | None:
        if self.program_error is not None:
            return self.program_error
        return next((c.error for c in self.cores if c.error is not None), None)

    def finish(self) -> None:
        """Ends every state, waits for them to drain, and reports the outcome."""
        with self.lock:
            cores = list(self.cores)
        for core in cores:
            core.end()
        for core in cores:
            core.wait_finished()
        root = cores[0]
        if self.error is not None:
            self.emit(ProgramEvent("error", value=self.error))
        else:
            self.emit(ProgramEvent("end", value={"text": root.text, "vars": dict(root.vars),
                                                 "messages": list(root.messages)}))
        self.done.set()


class _Core:
    """One state's data and the worker thread that applies its ops."""

    def __init__(self, run: _Run, sid: int, parent: "_Core | None"):
        self.run, self.sid = run, sid
        self.cond = threading.Condition()
        self.text = ""
        self.vars: dict[str, Any] = {}
        self.meta: dict[str, Any] = {}
        self.messages: list[dict[str, Any]] = []
        self.images: list[ImageData] = []
        self.role: str | None = None
        self.role_start = 0
        self.role_suffix = ""
        self.scopes: dict[str, int] = {}
        if parent is not None:
            parent.copy_into(self)
        self.fork_start = len(self.text)
        self.assigned: dict[str, None] = {}  # names set by this state's own ops, in order
        self.streaming: dict[str, str] = {}  # partial text of gens in flight
        self.pending: Counter[str] = Counter()  # names that queued ops will set
        self.submitted = self.executed = 0
        self.error: BaseException | None = None
        self.ended = self.finished = False
        self.queue: queue.SimpleQueue[Node | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._work, name=f"radixlang-state-{sid}", daemon=True)
        self.thread.start()

    def copy_into(self, child: "_Core") -> None:
        with self.cond:
            child.text, child.vars, child.meta = self.text, dict(self.vars), dict(self.meta)
            child.messages = [dict(m) for m in self.messages]
            child.images = list(self.images)
            child.role, child.role_start, child.role_suffix = self.role, self.role_start, self.role_suffix
            child.scopes = dict(self.scopes)

    # ---- the program thread's side ----------------------------------------------------------------
    def submit(self, nodes: list[Node]) -> None:
        with self.cond:
            if self.ended:
                raise RuntimeError(f"state {self.sid} has finished (joined, or its program returned) "
                                   "and takes no more input")
            for node in nodes:
                self.pending.update(_sets(node))
                self.submitted += 1
                self.queue.put(node)  # under the lock, so nothing lands after end()'s sentinel

    def end(self) -> None:
        with self.cond:
            if not self.ended:
                self.ended = True
                self.queue.put(None)

    def sync(self) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.executed == self.submitted or self.finished)
            if self.error is not None:
                raise self.error

    def wait_finished(self) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.finished)

    def get_var(self, name: str) -> Any:
        with self.cond:
            self.cond.wait_for(lambda: not self.pending[name] or self.finished)
            if name in self.vars:
                return self.vars[name]
            if self.error is not None:
                raise self.error
        raise KeyError(f"variable {name!r} is not defined in this state")

    def view(self) -> StateView:
        with self.cond:
            return StateView(self.text, tuple(self.images))

    # ---- the worker's side ------------------------------------------------------------------------
    def _work(self) -> None:
        try:
            while (node := self.queue.get()) is not None:
                if self.error is None:
                    try:
                        if self.run.cancelled.is_set():
                            raise ProgramCancelled("the program run was cancelled")
                        self._execute(node)
                    except Exception as e:  # noqa: BLE001 - surfaced by error() / sync() / reads
                        with self.cond:
                            self.error = e
                with self.cond:
                    self.pending.subtract(_sets(node))
                    self.executed += 1
                    self.cond.notify_all()
        finally:  # even if the bookkeeping above broke, nobody may wait on this state forever
            with self.cond:
                self.finished = True
                if self.error is None and self.executed != self.submitted:
                    self.error = RuntimeError(f"state {self.sid} stopped with ops left (internal error)")
                self.cond.notify_all()

    def _execute(self, node: Node) -> None:
        if isinstance(node, Text):
            self._append(node.value)
        elif isinstance(node, Gen):
            self._gen(node)
        elif isinstance(node, Select):
            self._select(node)
        elif isinstance(node, RoleBegin):
            self._role_begin(node.role)
        elif isinstance(node, RoleEnd):
            self._role_end(node.role)
        elif isinstance(node, Image):
            with self.cond:
                self.images.append(node.source)
        elif isinstance(node, VarScopeBegin):
            self.scopes[node.name] = len(self.text)
        elif isinstance(node, VarScopeEnd):
            if node.name not in self.scopes:
                raise ValueError(f"var_scope {node.name!r} ends without beginning")
            self._set_var(node.name, self.text[self.scopes.pop(node.name):])
        elif isinstance(node, SetVar):
            self._set_var(node.name, node.value)
        elif isinstance(node, _JoinOp):
            self._apply_join(node)
        else:
            raise AssertionError(f"unexpected node {node!r}")

    def _append(self, text: str) -> None:
        if not text:
            return
        with self.cond:
            self.text += text
            self.cond.notify_all()
        self.run.emit(ProgramEvent("text", self.sid, value=text))

    def _set_var(self, name: str, value: Any, meta: Any = None) -> None:
        with self.cond:
            self.vars[name] = value
            if meta is not None:
                self.meta[name] = meta
            self.assigned[name] = None
            self.cond.notify_all()
        self.run.emit(ProgramEvent("var", self.sid, name, value, meta))

    def _gen(self, node: Gen) -> None:
        gen = Gen(node.name, node.params.merged(self.run.defaults))
        name, parts, meta = gen.name, [], None
        if name is not None:
            with self.cond:
                self.streaming[name] = ""
        try:
            with contextlib.closing(iter(self.run.backend.generate(self.view(), gen))) as deltas:
                for delta in deltas:
                    if self.run.cancelled.is_set():
                        raise ProgramCancelled("the program run was cancelled")
                    if delta.text:
                        parts.append(delta.text)
                        with self.cond:
                            if name is not None:
                                self.streaming[name] += delta.text
                            self.text += delta.text
                            self.cond.notify_all()
                        self.run.emit(ProgramEvent("text", self.sid, value=delta.text))
                    if delta.meta is not None:
                        meta = delta.meta
        finally:
            if name is not None:
                with self.cond:
                    self.streaming.pop(name, None)
        if name is not None:
            self._set_var(name, "".join(parts), meta)

    def _select(self, node: Select) -> None:
        choices = list(node.choices)
        index, meta = self.run.backend.select(self.view(), choices, resolve_method(node.method))
        self._append(choices[index])
        if node.name is not None:
            self._set_var(node.name, choices[index], meta)

    def _role_begin(self, role: str) -> None:
        if self.role is not None:
            raise ValueError(f"role {role!r} begins inside role {self.role!r}; roles do not nest")
        prefix, suffix = self.run.template().affixes(role, self.messages)
        self._append(prefix)
        self.role, self.role_start, self.role_suffix = role, len(self.text), suffix

    def _role_end(self, role: str) -> None:
        if self.role != role:
            raise ValueError(f"{role}_end has no matching {role}_begin (the open role is {self.role!r})")
        content = self.text[self.role_start:]
        self._append(self.role_suffix)
        with self.cond:
            self.messages.append({"role": role, "content": content})
            self.role = None

    def _apply_join(self, op: _JoinOp) -> None:
        if op.mode == "concate_and_append":
            self._append(op.text)
            return
        for name, values in op.values.items():
            self._set_var(name, values, op.metas.get(name))


def _sets(node: Node | None) -> Counter[str]:
    """The variable names an op sets (so reads of them wait for it)."""
    if isinstance(node, (Gen, Select)) and node.name is not None:
        return Counter((node.name,))
    if isinstance(node, (VarScopeEnd, SetVar)):
        return Counter((node.name,))
    if isinstance(node, _JoinOp):
        return Counter(node.values.keys())
    return Counter()


_END = object()


class StateOps:
    """Roles, scopes and copies, written once on top of `+=` and `fork` (shared with the tracer)."""

    def system(self, expr: Any = None) -> Any:
        return self._role("system", expr)

    def user(self, expr: Any = None) -> Any:
        return self._role("user", expr)

    def assistant(self, expr: Any = None) -> Any:
        return self._role("assistant", expr)

    def _role(self, role: str, expr: Any) -> Any:
        if expr is None:
            return self._role_scope(role)
        self += Seq([RoleBegin(role), expr, RoleEnd(role)])  # noqa: PLW0642 - appends; self is unchanged
        return None

    @contextlib.contextmanager
    def _role_scope(self, role: str) -> Iterator[None]:
        self += RoleBegin(role)  # noqa: PLW0642
        yield
        self += RoleEnd(role)  # noqa: PLW0642

    @contextlib.contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        """Everything appended inside the block becomes variable `name`."""
        _check_name(name)
        self += VarScopeBegin(name)  # noqa: PLW0642
        yield
        self += VarScopeEnd(name)  # noqa: PLW0642

    @contextlib.contextmanager
    def copy(self) -> Iterator[Any]:
        """A fork of one state whose variables join back when the block ends."""
        group = self.fork(1)
        yield group[0]
        group.join()


class ProgramState(StateOps):
    """The `s` a program receives: append with `+=`, read with `s["name"]`, `text()`, `messages()`."""

    def __init__(self, core: _Core):
        self._core = core

    # ---- building -----------------------------------------------------------------------------
    def __iadd__(self, other: Any) -> "ProgramState":
        self._core.submit(eager_nodes(other))
        return self

    def fork(self, size: int = 1) -> "ProgramStateGroup":
        """`size` copies of this state; the shared prefix is cached once, then the copies run in parallel."""
        return self._fork(size, None)

    def _fork(self, size: int, ids: list[int] | None) -> "ProgramStateGroup":
        check_fork_size(size)
        core, run = self._core, self._core.run
        core.sync()
        view = core.view()
        if size > 1 and view.text and not view.images:
            run.backend.cache_prefix(view.text)
        children = [run.new_core(core, None if ids is None else ids[i]) for i in range(size)]
        return ProgramStateGroup([ProgramState(c) for c in children], self)

    def set_var(self, name: str, value: Any) -> None:
        _check_name(name)
        self += SetVar(name, value)  # noqa: PLW0642

    __setitem__ = set_var

    # ---- reading -------------------------------------------------------------------------------
    def get_var(self, name: str) -> Any:
        self._settle(wait_all=False)
        return self._core.get_var(name)

    __getitem__ = get_var

    def __contains__(self, name: str) -> bool:
        self._settle(wait_all=False)
        with self._core.cond:
            return name in self._core.vars or bool(self._core.pending[name])

    def get_meta_info(self, name: str) -> Any:
        """What the backend reported for variable `name` (token counts, finish reason, logprobs, scores)."""
        self.get_var(name)
        with self._core.cond:
            return self._core.meta.get(name)

    def text(self) -> str:
        self.sync()
        return self._core.text

    def messages(self) -> list[dict[str, Any]]:
        """The conversation so far, as chat messages ({"role", "content"})."""
        self.sync()
        return [dict(m) for m in self._core.messages]

    def images(self) -> list[ImageData]:
        self.sync()
        return list(self._core.images)

    @property
    def ret_value(self) -> Any:
        """The program function's return value (once it returned)."""
        self._core.run.done.wait()
        return self._core.run.ret_value

    def sync(self) -> None:
        """Waits until everything appended so far ran; raises the program's exception, if any."""
        error = self.error()
        if error is not None:
            raise error

    def error(self) -> BaseException | None:
        """The exception that stopped this state (for a program's own state: its whole run), or None."""
        self._settle(wait_all=True)
        return self._error()

    def _error(self) -> BaseException | None:
        core = self._core
        if core.sid == 0 and core.finished:  # the run is ending: report any error of any of its states
            core.run.done.wait()
            return core.run.error
        return core.error

    def _settle(self, wait_all: bool) -> None:
        """Outside the program, waits for the run to end; inside it, for this state's queued ops."""
        core = self._core
        if threading.current_thread() is not core.run.program_thread:
            core.run.done.wait()
        elif wait_all:
            with core.cond:
                core.cond.wait_for(lambda: core.executed == core.submitted or core.finished)

    # ---- streaming ------------------------------------------------------------------------------
    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """Yields the state's text (or one variable's) as it is generated, until it is complete."""
        core = self._core
        pos = 0
        current, complete = self._stream_source(var_name)
        while True:
            with core.cond:
                core.cond.wait_for(lambda: len(current()) > pos or complete())
                chunk, finished = current()[pos:], complete()
            pos += len(chunk)
            if chunk:
                yield chunk
            if finished and not chunk:
                break
        error = self._error()
        if error is not None:
            raise error

    def _stream_source(self, name: str | None) -> tuple[Callable[[], str], Callable[[], bool]]:
        core = self._core
        if name is None:
            return (lambda: core.text), (lambda: core.finished)

        def current() -> str:
            if name in core.streaming:
                return core.streaming[name]
            value = core.vars.get(name, "")
            return value if isinstance(value, str) else str(value)

        def complete() -> bool:
            settled = not core.pending[name] and name not in core.streaming
            return core.finished or (settled and name in core.vars)

        return current, complete

    async def text_async_iter(self, var_name: str | None = None,
                              return_meta_data: bool = False) -> AsyncIterator[Any]:
        """`text_iter` for asyncio. With return_meta_data, yields (chunk, the variable's meta info so
        far); the last pair carries the final meta info (with an empty chunk if it came after the text)."""
        chunks = self.text_iter(var_name)
        meta = None
        while (chunk := await asyncio.to_thread(next, chunks, _END)) is not _END:
            if not return_meta_data:
                yield chunk
                continue
            meta = self._meta_now(var_name)
            yield chunk, meta
        if return_meta_data and (final := self._meta_now(var_name)) is not meta:
            yield "", final

    def _meta_now(self, var_name: str | None) -> Any:
        with self._core.cond:
            return self._core.meta.get(var_name) if var_name is not None else None

    def __aiter__(self) -> AsyncIterator[str]:
        return self.text_async_iter()

    def __repr__(self) -> str:
        return f"ProgramState(state={self._core.sid}, chars={len(self._core.text)})"


class ProgramStateGroup:
    """The states of one fork; `+=` appends to each, `join` merges them back into the parent."""

    def __init__(self, states: list[Any], parent: Any):
        self.states = states
        self.parent = parent
        self.joined = False

    def __getitem__(self, i: int) -> Any:
        return self.states[i]

    def __setitem__(self, i: int, value: Any) -> None:
        if value is not self.states[i]:  # `forks[i] += x` assigns the same state back; nothing else may
            raise TypeError("the states of a fork cannot be replaced")

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.states)

    def __iadd__(self, other: Any) -> "ProgramStateGroup":
        if callable(other) and not isinstance(other, Node):  # a function of the child's index
            for i, state in enumerate(self.states):
                state += other(i)
        elif isinstance(other, (list, tuple)):
            if len(other) != len(self.states):
                raise ValueError(f"appending a list to a fork of {len(self.states)} needs {len(self.states)} "
                                 f"items, got {len(other)}")
            for state, item in zip(self.states, other):
                state += item
        else:
            for state in self.states:
                state += other
        return self

    def join(self, mode: str = "gather_variable") -> None:
        """gather_variable: each variable the children set becomes a list in the parent;
        concate_and_append: the children's new text is appended to the parent in order."""
        if mode not in JOIN_MODES:
            raise ValueError(f"join mode must be one of {JOIN_MODES}, got {mode!r}")
        if self.joined:
            raise RuntimeError("this fork was already joined")
        self.joined = True
        self._join(mode)

    def _join(self, mode: str) -> None:
        cores = [s._core for s in self.states]
        for core in cores:
            core.end()
        for core in cores:
            core.wait_finished()
            if core.error is not None:
                raise core.error
        values: dict[str, list[Any]] = {}
        metas: dict[str, list[Any]] = {}
        if mode == "gather_variable":
            for core in cores:
                for name in core.assigned:
                    values.setdefault(name, []).append(core.vars[name])
                    metas.setdefault(name, []).append(core.meta.get(name))
        text = "".join(core.text[core.fork_start:] for core in cores) if mode == "concate_and_append" else ""
        self.parent._core.submit([_JoinOp(mode, values, metas, text)])


def eager_nodes(item: Any) -> list[Node]:
    """The ops `s += item` appends, for a running program."""
    if isinstance(item, str):
        return [Text(item)]
    if isinstance(item, Seq):
        return [n for x in item.nodes for n in eager_nodes(x)]
    if isinstance(item, Select) and not isinstance(item.choices, list):
        raise TypeError("select's choices must be a list of strings when the program runs")
    if isinstance(item, Image) and not isinstance(item.source, ImageData):
        raise TypeError("image() needs the image itself when the program runs")
    if isinstance(item, _EAGER_NODES):
        return [item]
    if isinstance(item, Placeholder):
        raise TypeError("a traced placeholder cannot be appended to a running program")
    raise TypeError(f"cannot append {type(item).__name__} to a program state; append a string or a "
                    "primitive (gen, select, image, a role)")


def check_fork_size(size: Any) -> None:
    if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= MAX_FORK_SIZE:
        raise ValueError(f"fork size must be an integer in [1, {MAX_FORK_SIZE}], got {size!r}")


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"a variable name must be a non-empty string, got {name!r}")
