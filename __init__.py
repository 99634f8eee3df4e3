"""radixlang: structured-generation programs on a radix-tree KV cache runtime.

`import radixlang as rl` (or `as sgl`: SGLang's frontend names work). Importing the package is
light; the engine (and torch) load on first use of `rl.Engine` or `rl.Runtime(...)`.
"""
from typing import Any

from radixlang.lang import *  # noqa: F403 - the public API (absolute: pytest imports this file by path)
from radixlang.lang import __all__ as _lang_all

__all__ = [*_lang_all, "Engine"]


def __getattr__(name: str) -> Any:  # noqa: ANN401 - a module attribute made on first use (the Engine class)
    if name == "Engine":  # imports torch
        from radixlang.runtime.engine import Engine

        return Engine
    raise AttributeError(f"module 'radixlang' has no attribute {name!r}")
