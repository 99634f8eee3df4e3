"""`@program` (alias `function`): a Python function of a state that runs, batches and traces."""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, overload

from .default_backend import BackendArg
from .gen_params import RUN_FIELDS, sampling_defaults
from .interpreter import run_batch, run_program, run_remote
from .ir_json import ProgramIR
from .state import ProgramState
from .tracer import TracingState, trace_program


class Program:
    """A program: `func(s, *args)` appends to the state `s`.

    `run(*args, stream=False, backend=None, **sampling_defaults_and_args)` runs it;
    `run_batch([...])` runs many; `trace(**fixed_args)` records it as IR.
    """

    def __init__(self, func: Callable[..., Any], bind_arguments: dict[str, Any] | None = None,
                 num_api_spec_tokens: int | None = None):
        if num_api_spec_tokens is not None and (not isinstance(num_api_spec_tokens, int)
                                                or isinstance(num_api_spec_tokens, bool) or num_api_spec_tokens < 1):
            raise ValueError(f"num_api_spec_tokens must be an integer >= 1, got {num_api_spec_tokens!r}")
        # SGLang's API speculative execution saves an API backend's prompt tokens; radixlang's backends
        # reuse the prefix from the radix cache instead, so it has no effect here (streaming is refused
        # with it, as in SGLang)
        self.num_api_spec_tokens = num_api_spec_tokens
        if not callable(func):
            raise TypeError(f"program takes a function, got {type(func).__name__}")
        self.func = func
        self.signature = inspect.signature(func)
        params = list(self.signature.parameters.values())
        if not params or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
            raise TypeError(f"{func.__name__}: a program's first parameter receives the state (s)")
        self.state_param = params[0].name
        self.arg_names = [p.name for p in params[1:] if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        self.bind_arguments = dict(bind_arguments or {})
        self.name = func.__name__
        functools.update_wrapper(self, func)

    def bind(self, **kwargs: object) -> "Program":
        """A copy of this program with some arguments fixed."""
        unknown = sorted(set(kwargs) - set(self.arg_names))
        if unknown:
            raise TypeError(f"{self.name}() has no argument(s) {unknown}")
        return Program(self.func, {**self.bind_arguments, **kwargs}, self.num_api_spec_tokens)

    def run(self, *args: object, stream: bool = False, backend: BackendArg = None, remote: bool = False,
            **kwargs: object) -> ProgramState:
        """Runs the program. Keyword arguments named like run()'s sampling defaults (max_new_tokens,
        temperature, stop, ...) set them; the rest go to the program. Errors inside the program
        surface through `state.error()` and are raised by `state.sync()` and by reads."""
        if stream and self.num_api_spec_tokens is not None:
            raise ValueError(f"{self.name}: stream=True cannot be used with num_api_spec_tokens (as in SGLang)")
        self._pop_n(kwargs)
        sampling = {k: kwargs.pop(k) for k in list(kwargs) if k in RUN_FIELDS}
        defaults = sampling_defaults(sampling)
        call = self._call(args, kwargs)
        if remote:
            return run_remote(self, self._values(args, kwargs), backend, sampling, stream)
        return run_program(call, backend, defaults, stream)

    def run_batch(self, batch_kwargs: list[dict[str, Any]] | list[tuple], *, num_threads: int | str = "auto",
                  progress_bar: bool = False, backend: BackendArg = None, **sampling: object) -> list[ProgramState]:
        """Runs the program once per item (a dict of arguments, or a tuple of positional ones).

        The text every run starts with is cached once first; it is found by tracing the program up
        to its first op that depends on an argument or on generation."""
        if not isinstance(batch_kwargs, (list, tuple)):
            raise TypeError(f"run_batch takes a list of argument dicts, got {type(batch_kwargs).__name__}")
        self._pop_n(sampling)
        defaults = sampling_defaults(sampling)
        calls = []
        for i, item in enumerate(batch_kwargs):
            if isinstance(item, dict):
                calls.append(self._call((), dict(item)))
            elif isinstance(item, (list, tuple)):
                calls.append(self._call(tuple(item), {}))
            else:
                raise TypeError(f"run_batch item {i} must be a dict or a tuple of arguments, got {type(item).__name__}")
        return run_batch(self, calls, backend, defaults, num_threads, progress_bar)

    def trace(self, **kwargs: object) -> ProgramIR:
        """Records the program as IR. Given arguments are fixed into it; the others become its params."""
        return trace_program(self, kwargs)

    def __call__(self, *args: object,
                 **kwargs: Any,  # noqa: ANN401 - run()'s options or the function's arguments, passed on as given
                 ) -> Any:  # noqa: ANN401 - the function's result (in a program) or a ProgramState
        """Inside another program, `prog(s, ...)` appends to `s`; elsewhere it is `run`."""
        if args and isinstance(args[0], (ProgramState, TracingState)):
            return self.func(*args, **kwargs)
        return self.run(*args, **kwargs)

    def _pop_n(self, kwargs: dict[str, object]) -> None:
        """SGLang's run(n=1): taken unless the program has an argument `n`; only 1 (fork for several)."""
        if "n" in kwargs and "n" not in self.arg_names and kwargs.pop("n") not in (None, 1):
            raise ValueError(f"{self.name}: run(n=...) must be 1; fork the state for several samples")

    def _call(self, args: tuple, kwargs: dict[str, object]) -> Callable[[ProgramState], Any]:
        bound = self.signature.bind(None, *args, **{**self.bind_arguments, **kwargs})  # TypeError on mismatch
        rest_args, rest_kwargs = bound.args[1:], bound.kwargs
        return lambda s: self.func(s, *rest_args, **rest_kwargs)

    def _values(self, args: tuple, kwargs: dict[str, object]) -> dict[str, Any]:
        bound = self.signature.bind(None, *args, **{**self.bind_arguments, **kwargs})
        return {k: v for k, v in bound.arguments.items() if k != self.state_param}

    def __repr__(self) -> str:
        return f"Program({self.name})"


@overload
def program(func: Callable[..., Any], num_api_spec_tokens: int | None = None) -> Program: ...
@overload
def program(func: None = None, num_api_spec_tokens: int | None = None) -> Callable[[Callable[..., Any]], Program]: ...


def program(func: Callable[..., Any] | None = None,
            num_api_spec_tokens: int | None = None) -> Program | Callable[[Callable[..., Any]], Program]:
    """Decorator: `@program` or `@program()` turns `def f(s, ...)` into a Program
    (`num_api_spec_tokens`: SGLang's, accepted; see Program)."""
    if func is None:
        return lambda f: Program(f, num_api_spec_tokens=num_api_spec_tokens)
    return Program(func, num_api_spec_tokens=num_api_spec_tokens)


function = program  # SGLang's name
