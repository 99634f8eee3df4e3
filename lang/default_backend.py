"""The backend a program runs on: the one passed, an in-process Engine wrapped, or the default one."""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Union

from .backend import Backend
from .engine_backend import EngineBackend
from .global_config import global_config

if TYPE_CHECKING:
    from ..runtime.engine import Engine

# what a caller may pass as a backend: a Backend (Runtime, Endpoint, ...), an in-process Engine, or None
# (the default backend)
BackendArg = Union[Backend, "Engine", None]


def set_default_backend(backend: BackendArg) -> None:
    """The backend `run` uses when none is passed: a Runtime, Endpoint, Engine or any Backend."""
    global_config.default_backend = as_backend(backend)


def as_backend(backend: BackendArg) -> Backend:
    """A Backend from a backend, an in-process Engine, or None (the default backend)."""
    if backend is None:
        default = global_config.default_backend
        if default is None:
            raise ValueError("no backend: pass backend=... or call set_default_backend(...) first")
        if not isinstance(default, Backend):  # set through global_config (as SGLang programs may): wrap it once
            default = global_config.default_backend = as_backend(default)
        return default
    engine_module = sys.modules.get("radixlang.runtime.engine")  # loaded if an Engine exists: no import needed
    if engine_module is not None and isinstance(backend, engine_module.Engine):
        return EngineBackend(backend)
    if not isinstance(backend, Backend):
        raise TypeError(f"backend must be a Runtime, Endpoint, Engine or Backend, got {type(backend).__name__}")
    return backend
