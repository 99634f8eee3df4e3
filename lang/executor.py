"""The executor under program states: each state's data and the worker thread that applies its ops
in order, so `s += gen(...)` returns at once, reading a variable waits for it, and the states of a
fork run in parallel.

All states of one run share a `Run`: the backend, the sampling defaults, the chat template and, for
server-side runs, the queue of events that streams the program's progress.
"""
from __future__ import annotations

import contextlib
import queue
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar

from .backend import Backend, StateView
from .chat import ChatTemplate
from .choices import resolve_method
from .gen_params import GenParams
from .ir import (
    Arg,
    Gen,
    Image,
    ImageData,
    Node,
    RoleBegin,
    RoleEnd,
    Select,
    SeparateReasoning,
    SetVar,
    Text,
    VarScopeBegin,
    VarScopeEnd,
)
from .reasoning import reasoning_format, reasoning_variable
from .tools import parsed_calls


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
    meta: dict[str, Any] | list[Any] | None = None  # a fork's gathered variable: a list, one per state

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
class JoinOp(Node):
    """Merges a finished fork into its parent (internal: built by ProgramStateGroup.join)."""

    mode: str
    values: dict[str, list[Any]]
    metas: dict[str, list[Any]]
    text: str
    kind: ClassVar[str] = "_join"




class Run:
    """What the states of one program run share."""

    def __init__(self, backend: Backend, defaults: GenParams, events: queue.Queue | None = None):
        self.backend = backend
        self.defaults = defaults
        self.events = events
        self.lock = threading.Lock()
        self.cores: list[StateCore] = []
        self.next_id = 0
        self.done = threading.Event()  # the program returned and every state drained
        self.cancelled = threading.Event()
        self.program_thread: threading.Thread | None = None
        self.program_error: BaseException | None = None
        self.ret_value: Any = None
        self._template: ChatTemplate | None = None
        self._template_fetched = False
        self.pin_group = f"program:{id(self):x}"  # what a backend keeps for this run's states, released by finish

    def new_core(self, parent: "StateCore | None", sid: int | None = None) -> "StateCore":
        with self.lock:
            if sid is None:
                sid = self.next_id
            self.next_id = max(self.next_id, sid + 1)
            core = StateCore(self, sid, parent)
            self.cores.append(core)
        return core

    def template(self) -> ChatTemplate:
        with self.lock:
            if not self._template_fetched:
                self._template = self.backend.chat_template()
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
        release = getattr(self.backend, "release_program", None)  # optional: the engine backend's KV pins
        if release is not None:
            release(self.pin_group)
        root = cores[0]
        if self.error is not None:
            self.emit(ProgramEvent("error", value=self.error))
        else:
            self.emit(ProgramEvent("end", value={"text": root.text, "vars": dict(root.vars),
                                                 "messages": list(root.messages)}))
        self.done.set()


class StateCore:
    """One state's data and the worker thread that applies its ops."""

    def __init__(self, run: Run, sid: int, parent: "StateCore | None"):
        self.run, self.sid = run, sid
        self.cond = threading.Condition()
        self.text = ""
        self.vars: dict[str, Any] = {}
        self.meta: dict[str, Any] = {}
        self.messages: list[dict[str, Any]] = []
        self.images: list[ImageData] = []
        self.image_offsets: list[int] = []  # where each image sits in the text
        self.role: str | None = None
        self.role_start = 0
        self.role_suffix = ""
        self.scopes: dict[str, int] = {}
        self.starts: dict[str, int] = {}  # where each gen / select variable's text begins in `text`
        if parent is not None:
            parent.copy_into(self)
        self.fork_start = len(self.text)
        self.assigned: dict[str, None] = {}  # names set by this state's own ops, in order
        self.streaming: dict[str, str] = {}  # partial text of gens in flight
        # each gen's stream steps: (the variable's length after the step, the step's meta info)
        self.progress: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        self.pending: Counter[str] = Counter()  # names that queued ops will set
        self.submitted = self.executed = 0
        self.error: BaseException | None = None
        self.ended = self.finished = False
        self.queue: queue.SimpleQueue[Node | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._work, name=f"radixlang-state-{sid}", daemon=True)
        self.thread.start()

    def copy_into(self, child: "StateCore") -> None:
        with self.cond:
            child.text, child.vars, child.meta = self.text, dict(self.vars), dict(self.meta)
            child.messages = [dict(m) for m in self.messages]
            child.images, child.image_offsets = list(self.images), list(self.image_offsets)
            child.role, child.role_start, child.role_suffix = self.role, self.role_start, self.role_suffix
            child.scopes, child.starts = dict(self.scopes), dict(self.starts)

    # ---- the program thread's side ----------------------------------------------------------------
    def submit(self, nodes: list[Node]) -> None:
        with self.cond:
            if self.ended:
                raise RuntimeError(f"state {self.sid} has finished (joined, or its program returned) "
                                   "and takes no more input")
            for node in nodes:
                self.pending.update(variables_set_by(node))
                self.submitted += 1
                self.queue.put(node)  # under the lock, so nothing lands after end()'s sentinel

    def end(self) -> None:
        with self.cond:
            if not self.ended:
                self.ended = True
                self.queue.put(None)

    def set_after_end(self, name: str, value: object) -> None:
        """SGLang lets a caller set a variable on a finished state (`state["n"] = int(state["n"])`)."""
        self.wait_finished()
        with self.cond:
            self.vars[name] = value
            self.meta.pop(name, None)
            self.cond.notify_all()

    def sync(self) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.executed == self.submitted or self.finished)
            if self.error is not None:
                raise self.error

    def wait_finished(self) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.finished)

    def get_var(self, name: str) -> object:
        with self.cond:
            self.cond.wait_for(lambda: not self.pending[name] or self.finished)
            if name in self.vars:
                return self.vars[name]
            if self.error is not None:
                raise self.error
        raise KeyError(f"variable {name!r} is not defined in this state")

    def view(self) -> StateView:
        with self.cond:
            return StateView(self.text, tuple(self.images), tuple(self.image_offsets),
                             owner=f"{self.run.pin_group}/{self.sid}")

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
                    self.pending.subtract(variables_set_by(node))
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
            assert not isinstance(node.source, Arg), "a program's arguments are bound before its nodes run"
            with self.cond:
                self.images.append(node.source)
                self.image_offsets.append(len(self.text))
        elif isinstance(node, VarScopeBegin):
            self.scopes[node.name] = len(self.text)
        elif isinstance(node, VarScopeEnd):
            if node.name not in self.scopes:
                raise ValueError(f"var_scope {node.name!r} ends without beginning")
            self._set_var(node.name, self.text[self.scopes.pop(node.name):])
        elif isinstance(node, SetVar):
            self._set_var(node.name, node.value)
        elif isinstance(node, JoinOp):
            self._apply_join(node)
        elif isinstance(node, SeparateReasoning):
            self._separate_reasoning(node)
        else:
            raise AssertionError(f"unexpected node {node!r}")

    def _append(self, text: str) -> None:
        if not text:
            return
        with self.cond:
            self.text += text
            self.cond.notify_all()
        self.run.emit(ProgramEvent("text", self.sid, value=text))

    def _set_var(self, name: str, value: object, meta: dict[str, Any] | list[Any] | None = None) -> None:
        with self.cond:
            self.vars[name] = value
            if meta is not None:
                self.meta[name] = meta
            self.assigned[name] = None
            self.cond.notify_all()
        self.run.emit(ProgramEvent("var", self.sid, name, value, meta))

    def _gen(self, node: Gen) -> None:
        gen = Gen(node.name, node.params.merged(self.run.defaults))
        name, parts, meta, start = gen.name, [], None, len(self.text)
        if name is not None:
            with self.cond:
                self.streaming[name] = ""
                self.progress[name] = []
        try:
            with contextlib.closing(iter(self.run.backend.generate(self.view(), gen))) as deltas:
                for delta in deltas:
                    if self.run.cancelled.is_set():
                        raise ProgramCancelled("the program run was cancelled")
                    parts.append(delta.text)
                    with self.cond:  # text and its step's meta together: a reader sees both or neither
                        self.text += delta.text
                        if name is not None:
                            self.streaming[name] += delta.text
                            if delta.progress is not None:
                                self.progress[name].append((len(self.streaming[name]), delta.progress))
                        self.cond.notify_all()
                    if delta.text:
                        self.run.emit(ProgramEvent("text", self.sid, value=delta.text))
                    if delta.meta is not None:
                        meta = delta.meta
        finally:
            if name is not None:
                with self.cond:
                    self.streaming.pop(name, None)
        if name is not None:
            text = "".join(parts)
            self.starts[name] = start
            self._set_var(name, parsed_calls(text, meta, name) if gen.params.tool_calls else text, meta)

    def _select(self, node: Select) -> None:
        assert not isinstance(node.choices, Arg), "a program's arguments are bound before its nodes run"
        choices = list(node.choices)
        index, meta = self.run.backend.select(self.view(), choices, resolve_method(node.method))
        start = len(self.text)
        self._append(choices[index])
        if node.name is not None:
            self.starts[node.name] = start
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

    def _separate_reasoning(self, node: SeparateReasoning) -> None:
        form = reasoning_format(node.model_type)
        # the last variable first, so that cutting one leaves the offsets of those before it true
        for name in sorted(node.names, key=lambda n: self.starts.get(n, -1), reverse=True):
            value = self.vars.get(name)
            if not isinstance(value, str):
                raise ValueError(f"separate_reasoning: variable {name!r} holds no generated text")
            reasoning, answer = form.split(value)
            start = self.starts.get(name, -1)
            end = start + len(value)
            with self.cond:
                # the text keeps the answer where the variable's text was (so the role's message is the
                # answer, as in SGLang); a stream of the state's text has shown the reasoning already
                if start >= 0 and self.text[start:end] == value:
                    self.text = self.text[:start] + answer + self.text[end:]
                    shift = len(answer) - len(value)
                    self.image_offsets = [o + shift if o >= end else o for o in self.image_offsets]
            self._set_var(name, answer)
            self._set_var(reasoning_variable(name), reasoning)

    def _apply_join(self, op: JoinOp) -> None:
        if op.mode == "concate_and_append":
            self._append(op.text)
            return
        for name, values in op.values.items():
            self._set_var(name, values, op.metas.get(name))


def variables_set_by(node: Node | None) -> Counter[str]:
    """The variable names an op sets (so reads of them wait for it)."""
    if isinstance(node, (Gen, Select)) and node.name is not None:
        return Counter((node.name,))
    if isinstance(node, (VarScopeEnd, SetVar)):
        return Counter((node.name,))
    if isinstance(node, JoinOp):
        return Counter(node.values.keys())
    if isinstance(node, SeparateReasoning):
        return Counter([*node.names, *map(reasoning_variable, node.names)])
    return Counter()
