"""Runs programs: Python program functions, IR programs (the server runs these), batches, remote runs."""
from __future__ import annotations

import queue
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, Callable, Iterator, Mapping

from tqdm import tqdm

from .backend import Backend
from .config import RUN_BATCH_AUTO_THREADS
from .default_backend import BackendArg, as_backend
from .executor import ProgramEvent, Run
from .gen_params import GenParams, sampling_defaults
from .global_config import global_config
from .images import load_image
from .ir import Arg, Fork, Image, Join, Node, Select, Text, Var, check_choices
from .ir_json import ProgramIR
from .state import ProgramState
from .tracer import Traceable, constant_prefix, trace_program


def run_program(func: Callable[[ProgramState], Any], backend: BackendArg, defaults: GenParams, stream: bool,
                events: queue.Queue | None = None) -> ProgramState:
    """Runs `func(state)`; with stream, in a background thread (the state streams as it grows)."""
    run = Run(as_backend(backend), defaults, events)
    state = ProgramState(run.new_core(None))

    def body() -> None:
        try:
            run.ret_value = func(state)
        except Exception as e:  # noqa: BLE001 - surfaced through state.error() / sync()
            run.program_error = e
            run.cancelled.set()  # the run failed: its other states stop instead of generating for nothing
        except BaseException as e:  # e.g. KeyboardInterrupt: stop the generations in flight, then re-raise
            run.program_error = e
            run.cancelled.set()
            raise
        finally:
            run.finish()
            if global_config.verbosity >= 2:
                print(state._core.text)

    if stream:
        run.program_thread = threading.Thread(target=body, name="radixlang-program", daemon=True)
        run.program_thread.start()
    else:
        run.program_thread = threading.current_thread()
        body()
    return state


def run_batch(program: Traceable, calls: list[Callable[[ProgramState], Any]], backend: BackendArg,
              defaults: GenParams, num_threads: int | str, progress_bar: bool) -> list[ProgramState]:
    """Runs one program per call, `num_threads` at a time, after caching their shared constant prefix."""
    backend = as_backend(backend)
    threads = _thread_count(num_threads, len(calls))
    if len(calls) > 1 and global_config.enable_precache_with_tracing:
        _precache(program, backend)
    with ThreadPoolExecutor(threads, thread_name_prefix="radixlang-batch") as pool:
        futures = [pool.submit(run_program, call, backend, defaults, False) for call in calls]
        if progress_bar:  # updated from this thread only, as programs finish
            for _ in tqdm(as_completed(futures), total=len(futures), desc="run_batch"):
                pass
        states = [f.result() for f in futures]
    return states


def _thread_count(num_threads: int | str, batch: int) -> int:
    if num_threads == "auto":
        return max(1, min(RUN_BATCH_AUTO_THREADS, batch))
    if not isinstance(num_threads, int) or isinstance(num_threads, bool) or num_threads < 1:
        raise ValueError(f"num_threads must be 'auto' or an integer >= 1, got {num_threads!r}")
    return min(num_threads, max(batch, 1))


def _precache(program: Traceable, backend: Backend) -> None:
    nodes = constant_prefix(program)
    if not nodes:
        return
    prefix = run_program(lambda s: _append_all(s, nodes), backend, GenParams(), stream=False)
    if prefix.error() is None and prefix.text():  # a prefix that fails to render fails the runs themselves
        backend.cache_prefix(prefix.text())


def _append_all(state: ProgramState, nodes: list[Node]) -> None:
    for node in nodes:
        state += node


# ---- IR programs --------------------------------------------------------------------------------------
def replay(state: ProgramState, ir: ProgramIR, args: Mapping[str, Any]) -> None:
    """Applies an IR program's ops in order, exactly as its Python code did when it was traced."""
    states: dict[int, ProgramState] = {0: state}
    groups: dict[tuple[int, ...], Any] = {}
    for op in ir.ops:
        target, node = states[op.state], op.node
        if isinstance(node, Fork):
            group = target._fork(node.size, node.children)
            states.update(zip(node.children, group.states))
            groups[tuple(node.children)] = group
        elif isinstance(node, Join):
            groups.pop(tuple(node.children)).join(node.mode)
        else:
            target += _bind(node, args, states)


def _bind(node: Node, args: Mapping[str, Any], states: Mapping[int, ProgramState]) -> Node:
    """The op with its argument and variable references replaced by their values."""
    if isinstance(node, Arg):
        value = args[node.name]
        if not isinstance(value, (str, int, float)):
            raise TypeError(f"argument {node.name!r} is inserted as text, so it must be a string or a number, "
                            f"got {type(value).__name__}")
        return Text(str(value))
    if isinstance(node, Var):
        try:
            value = states[node.source].get_var(node.name)
        except KeyError:  # the IR reads a variable that no earlier op of that state sets
            raise ValueError(f"the program reads variable {node.name!r} of state {node.source}, which no earlier "
                             "op (gen, select or join) of that state sets") from None
        if not isinstance(value, str):
            raise TypeError(f"variable {node.name!r} is inserted as text but holds a {type(value).__name__}")
        return Text(value)
    if isinstance(node, Select) and isinstance(node.choices, Arg):
        choices = check_choices(args[node.choices.name], f"select {node.name!r}")
        return Select(node.name, choices, node.method, node.temperature)
    if isinstance(node, Image) and isinstance(node.source, Arg):
        return Image(load_image(args[node.source.name]))
    return node


def _load(ir: ProgramIR | str | bytes | Mapping[str, Any], args: Mapping[str, Any] | None) -> tuple[ProgramIR, dict]:
    if isinstance(ir, ProgramIR):
        ir.validate()
        program = ir
    elif isinstance(ir, (str, bytes)):
        program = ProgramIR.from_json(ir)
    else:
        program = ProgramIR.from_dict(ir)
    args = dict(args or {})
    missing = [p for p in program.params if p not in args]
    unknown = sorted(set(args) - set(program.params))
    if missing or unknown:
        raise ValueError(f"program {program.name!r} takes arguments {program.params}; "
                         f"missing {missing}, unknown {unknown}")
    return program, args


def interpret(ir: ProgramIR | str | Mapping[str, Any], args: Mapping[str, Any] | None = None, *,
              backend: BackendArg = None, stream: bool = False, **sampling: object) -> ProgramState:
    """Runs an IR program with its arguments; returns its state, like `Program.run`."""
    program, args = _load(ir, args)
    return run_program(lambda s: replay(s, program, args), backend, sampling_defaults(sampling), stream)


def run_ir(ir: ProgramIR | str | Mapping[str, Any], args: Mapping[str, Any] | None, backend: BackendArg,
           sampling: Mapping[str, Any] | None = None) -> "ProgramRun":
    """Runs an IR program and streams its events (for a server: `event.to_dict()` per event).

    Bad input (IR, arguments, sampling defaults) raises ValueError here, before anything runs. The
    stream ends with one `end` or `error` event; `cancel()` (from any thread) or closing it early
    stops the run and aborts its engine requests.
    """
    program, args = _load(ir, args)
    defaults = sampling_defaults(sampling)
    backend = as_backend(backend)
    events: queue.Queue[ProgramEvent] = queue.Queue()
    state = run_program(lambda s: replay(s, program, args), backend, defaults, stream=True, events=events)
    return ProgramRun(events, state._core.run)


class ProgramRun(Iterator[ProgramEvent]):
    """The event stream of one IR run."""

    def __init__(self, events: "queue.Queue[ProgramEvent]", run: Run):
        self._events, self._run, self._ended = events, run, False

    def __next__(self) -> ProgramEvent:
        if self._ended:
            raise StopIteration
        event = self._events.get()
        self._ended = event.kind in ("end", "error")
        return event

    def cancel(self) -> None:
        """Stops the run; its stream still ends with an `error` event (ProgramCancelled)."""
        if not self._run.done.is_set():
            self._run.cancelled.set()

    def close(self) -> None:
        self.cancel()


# ---- remote runs ------------------------------------------------------------------------------------
def run_remote(program: Traceable, values: dict[str, Any], backend: BackendArg, sampling: dict[str, Any],
               stream: bool) -> ProgramState:
    """Ships the program, traced with its arguments, to an Endpoint's server, which runs it whole."""
    backend = as_backend(backend)
    if not hasattr(backend, "run_program"):
        raise ValueError("remote=True needs an Endpoint backend")
    ir = trace_program(program, values)
    defaults = sampling_defaults(sampling)
    return run_program(lambda s: _apply_events(s, backend.run_program(ir, {}, sampling)), backend, defaults, stream)


def _apply_events(state: ProgramState, events: Iterator[dict[str, Any]]) -> None:
    core = state._core
    for event in events:
        kind = event.get("event")
        if kind == "error":
            raise RuntimeError(f"the program failed on the server: {event.get('type')}: {event.get('error')}")
        if event.get("state", 0) != 0:
            continue
        if kind == "text":
            core._append(event["delta"])
        elif kind == "var":
            core._set_var(event["name"], event["value"], event.get("meta"))
        elif kind == "end":
            with core.cond:
                core.messages = list(event.get("messages", []))
                core.text = event.get("text", core.text)  # what the deltas built, less what separate_reasoning cut
            return
    raise RuntimeError("the server's program stream ended without an end event")
