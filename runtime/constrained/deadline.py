"""A compile deadline: a constraint that takes longer than its request's limit to build is refused (a 400),
and the worker that built it is free again at once.

Building an automaton is Python loops over states; the loops call `check()` (a context variable and a clock
read) every so often, and past the deadline it raises `CompileDeadline`. The compiler installs the
deadline around one compile (`limit`); outside one, `check` does nothing. Automata finished before the
deadline stay in the engine's cache (each is whole), so a retry starts where this one stopped.
"""
from __future__ import annotations

import contextlib
import contextvars
import time
from typing import Iterator

_DEADLINE: contextvars.ContextVar[tuple[float, float] | None] = contextvars.ContextVar("compile_deadline",
                                                                                    default=None)


class CompileDeadline(ValueError):
    """A constraint's compile went past its deadline (the request is refused; the engine stays healthy)."""


@contextlib.contextmanager
def limit(seconds: float | None, what: str = "constraint") -> Iterator[None]:
    """Compiles inside must finish within `seconds` (None or <= 0: no limit)."""
    if not seconds or seconds <= 0:
        yield
        return
    token = _DEADLINE.set((time.monotonic() + seconds, seconds))
    try:
        yield
    except CompileDeadline:
        raise CompileDeadline(f"{what} did not compile within the compile deadline of {seconds:g} s "
                              "(the engine's constraint_compile_timeout)") from None
    finally:
        _DEADLINE.reset(token)


def check() -> None:
    """Raises CompileDeadline once the installed deadline has passed."""
    held = _DEADLINE.get()
    if held is not None and time.monotonic() > held[0]:
        raise CompileDeadline("the deadline passed")


def at() -> float | None:
    """The installed deadline as a `time.monotonic()` time (None: none), for native loops that read the clock
    themselves (fsa's subset construction in C)."""
    held = _DEADLINE.get()
    return None if held is None else held[0]
