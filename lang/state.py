"""Program states: the `s` a program receives (`ProgramState`), a fork's states (`ProgramStateGroup`), and
the role / scope helpers both share with the tracer (`StateOps`). The work happens in executor.py."""
from __future__ import annotations

import asyncio
import contextlib
import threading
from contextlib import AbstractContextManager
from typing import Any, AsyncIterator, Callable, Generic, Iterator, Sequence, TypeVar, overload

from .config import MAX_FORK_SIZE
from .executor import JoinOp, StateCore
from .ir import (
    JOIN_MODES,
    Appendable,
    Gen,
    Image,
    ImageData,
    Node,
    Placeholder,
    RoleBegin,
    RoleEnd,
    Select,
    SeparateReasoning,
    Seq,
    SetVar,
    Text,
    VarScopeBegin,
    VarScopeEnd,
)

_EAGER_NODES = (Text, Gen, Select, RoleBegin, RoleEnd, Image, VarScopeBegin, VarScopeEnd, SetVar, SeparateReasoning)
S = TypeVar("S", bound="StateOps")  # a state type: a fork's states are of their parent's type


class StateOps:
    """Roles, scopes and copies, written once on top of `+=` and `fork` (shared with the tracer)."""

    def __iadd__(self: S, other: Appendable) -> S:
        raise NotImplementedError  # each subclass appends its own way

    def fork(self: S, size: int = 1) -> ProgramStateGroup[S]:
        raise NotImplementedError

    def _join_fork(self: S, children: list[S], mode: str) -> None:
        """Merges the states of one fork of this state back into it (ProgramStateGroup.join)."""
        raise NotImplementedError

    # `s.user("hi")` appends a whole turn; `with s.user(): ...` makes a turn of what the block appends
    @overload
    def system(self, expr: None = None) -> AbstractContextManager[None]: ...
    @overload
    def system(self, expr: Appendable) -> None: ...

    def system(self, expr: Appendable | None = None) -> AbstractContextManager[None] | None:
        return self._role("system", expr)

    @overload
    def user(self, expr: None = None) -> AbstractContextManager[None]: ...
    @overload
    def user(self, expr: Appendable) -> None: ...

    def user(self, expr: Appendable | None = None) -> AbstractContextManager[None] | None:
        return self._role("user", expr)

    @overload
    def assistant(self, expr: None = None) -> AbstractContextManager[None]: ...
    @overload
    def assistant(self, expr: Appendable) -> None: ...

    def assistant(self, expr: Appendable | None = None) -> AbstractContextManager[None] | None:
        return self._role("assistant", expr)

    def _role(self, role: str, expr: Appendable | None) -> AbstractContextManager[None] | None:
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
    def copy(self: S) -> Iterator[S]:
        """A fork of one state whose variables join back when the block ends."""
        group = self.fork(1)
        yield group[0]
        group.join()


class ProgramState(StateOps):
    """The `s` a program receives: append with `+=`, read with `s["name"]`, `text()`, `messages()`."""

    def __init__(self, core: StateCore):
        self._core = core

    # ---- building -----------------------------------------------------------------------------
    def __iadd__(self, other: Appendable) -> "ProgramState":
        self._core.submit(eager_nodes(other))
        return self

    def fork(self, size: int = 1) -> "ProgramStateGroup[ProgramState]":
        """`size` copies of this state; the shared prefix is cached once, then the copies run in parallel."""
        return self._fork(size, None)

    def _fork(self, size: int, ids: list[int] | None) -> "ProgramStateGroup[ProgramState]":
        check_fork_size(size)
        core, run = self._core, self._core.run
        core.sync()
        view = core.view()
        if size > 1 and view.text and not view.images:
            run.backend.cache_prefix(view.text)
        children = [run.new_core(core, None if ids is None else ids[i]) for i in range(size)]
        return ProgramStateGroup([ProgramState(c) for c in children], self)

    def _join_fork(self, children: list[ProgramState], mode: str) -> None:
        """Waits for the fork's states, then merges their variables or text into this state."""
        cores = [s._core for s in children]
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
        self._core.submit([JoinOp(mode, values, metas, text)])

    def set_var(self, name: str, value: object) -> None:
        """Inside the program, an op in order with the others; on a finished state (the program returned,
        or the fork was joined), the variable is set at once."""
        _check_name(name)
        with self._core.cond:
            ended = self._core.ended
        if ended:
            self._core.set_after_end(name, value)
        else:
            self += SetVar(name, value)  # noqa: PLW0642

    __setitem__ = set_var

    # ---- reading -------------------------------------------------------------------------------
    def get_var(self, name: str) -> Any:  # noqa: ANN401 - a variable holds any value the program stored
        """The variable's value; if the program failed before setting it, the program's own exception is
        raised (not the KeyError or cancellation that followed from it)."""
        self._settle(wait_all=False)
        try:
            return self._core.get_var(name)
        except Exception as failed:  # the variable is missing, or its op was cancelled by the failure
            error = self._run_error()
            if error is None or error is failed:
                raise
            raise error from failed

    def _run_error(self) -> BaseException | None:
        """The error that ended this state or, once the run is over, the run's first error."""
        core = self._core
        return core.run.error if core.run.done.is_set() else core.error

    __getitem__ = get_var

    def __contains__(self, name: str) -> bool:
        self._settle(wait_all=False)
        with self._core.cond:
            return name in self._core.vars or bool(self._core.pending[name])

    def get_meta_info(self, name: str) -> Any:  # noqa: ANN401 - the backend's meta dicts, lists of them after forks
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
    def ret_value(self) -> Any:  # noqa: ANN401 - the user's program function returns anything
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
        """`text_iter` for asyncio. With return_meta_data and a variable, yields (chunk, meta info) as SGLang
        does: the meta info of the stream steps the chunk covers (completion_tokens so far; with logprobs,
        these steps' output_token_logprobs and output_token_logprobs_length so far)."""
        chunks = self.text_iter(var_name)
        end, used = 0, 0
        while (chunk := await asyncio.to_thread(next, chunks, None)) is not None:  # text_iter yields str
            if not return_meta_data:
                yield chunk
                continue
            end += len(chunk)
            meta, used = self._chunk_meta(var_name, end, used)
            yield chunk, meta

    def _chunk_meta(self, var_name: str | None, end: int, used: int) -> tuple[Any, int]:
        """The merged meta info of the steps `var_name` took up to its text's length `end`, from step `used`
        on; and how many steps that used up."""
        if var_name is None:
            return None, used
        with self._core.cond:
            steps = list(self._core.progress.get(var_name, ()))
            final = self._core.meta.get(var_name)
        covered = [meta for length, meta in steps[used:] if length <= end]
        if not covered:
            return (steps[-1][1] if steps else final), used
        return merge_stream_meta(covered), used + len(covered)

    def __aiter__(self) -> AsyncIterator[str]:
        return self.text_async_iter()

    def __repr__(self) -> str:
        return f"ProgramState(state={self._core.sid}, chars={len(self._core.text)})"


class ProgramStateGroup(Generic[S]):
    """The states of one fork; `+=` appends to each, `join` merges them back into the parent."""

    def __init__(self, states: list[S], parent: S):
        self.states = states
        self.parent = parent
        self.joined = False

    def __getitem__(self, i: int) -> S:
        return self.states[i]

    def __setitem__(self, i: int, value: object) -> None:
        if value is not self.states[i]:  # `forks[i] += x` assigns the same state back; nothing else may
            raise TypeError("the states of a fork cannot be replaced")

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[S]:
        return iter(self.states)

    def __iadd__(self, other: Appendable | list[Appendable] | tuple[Appendable, ...] | Callable[[int], Appendable]
                 ) -> ProgramStateGroup[S]:
        states: Sequence[StateOps] = self.states  # (mypy cannot apply a self-typed += to a type variable)
        if callable(other) and not isinstance(other, Node):  # a function of the child's index
            for i, state in enumerate(states):
                state += other(i)
        elif isinstance(other, (list, tuple)):
            if len(other) != len(self.states):
                raise ValueError(f"appending a list to a fork of {len(self.states)} needs {len(self.states)} "
                                 f"items, got {len(other)}")
            for state, item in zip(states, other):
                state += item
        else:
            for state in states:
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
        self.parent._join_fork(self.states, mode)


STREAM_LISTS = ("output_token_logprobs", "output_top_logprobs")  # per-step lists a merged meta concatenates


def merge_stream_meta(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Several stream steps' meta info as one: the last step's counts, every step's logprob lists."""
    merged = dict(steps[-1])
    for key in STREAM_LISTS:
        if any(key in m for m in steps):
            merged[key] = [x for m in steps for x in m.get(key) or ()]
    return merged


def eager_nodes(item: object) -> list[Node]:
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


def check_fork_size(size: object) -> None:
    if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= MAX_FORK_SIZE:
        raise ValueError(f"fork size must be an integer in [1, {MAX_FORK_SIZE}], got {size!r}")


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"a variable name must be a non-empty string, got {name!r}")
