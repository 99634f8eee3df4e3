"""The backend a program runs on: the one passed, an in-process Engine wrapped, or the default one."""
from __future__ import annotations

import sys
import threading
from typing import Any

from .backend import Backend
from .engine_backend import EngineBackend

_default: Backend | None = None
_default_lock = threading.Lock()


def set_default_backend(backend: Any) -> None:
    """The backend `run` uses when none is passed: a Runtime, Endpoint, Engine or any Backend."""
    global _default
    wrapped = as_backend(backend)
    with _default_lock:
        _default = wrapped


def as_backend(backend: Any) -> Backend:
    """A Backend from a backend, an in-process Engine, or None (the default backend)."""
    if backend is None:
        with _default_lock:
            if _default is None:
                raise ValueError("no backend: pass backend=... or call set_default_backend(...) first")
            return _default
    engine_module = sys.modules.get("radixlang.runtime.engine")  # loaded if an Engine exists: no import needed
    if engine_module is not None and isinstance(backend, engine_module.Engine):
        return EngineBackend(backend)
    if not isinstance(backend, Backend):
        raise TypeError(f"backend must be a Runtime, Endpoint, Engine or Backend, got {type(backend).__name__}")
    return backend
