"""The native subset construction (subsets.c), a plain C library loaded with ctypes (built by c_library).

runtime/constrained/regex/native_subsets.py lays an NFA out as the arrays it reads; without the library (no
compiler, RADIXLANG_NATIVE_MASKS=0) fsa.subsets takes its Python path, to the same DFA.
"""
from __future__ import annotations

import ctypes
import functools

from .c_library import PTR, N, load

# rl_subsets's result: whether it finished (the Python side raises the matching error)
OK, TOO_LARGE, DEADLINE, NO_MEMORY = 0, 1, 2, 3


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded library, built on first call; None where it cannot be. Arrays pass as addresses
    (c_library.address), C-contiguous, of the dtypes subsets.c names."""
    lib = load("subsets.c")
    if lib is None:
        return None
    lib.rl_subsets.argtypes = [N, PTR, PTR, PTR, PTR, PTR, N, PTR, PTR, PTR, ctypes.c_int32, N, N, ctypes.c_double]
    lib.rl_subsets.restype = ctypes.c_void_p
    lib.rl_subsets_shape.argtypes = [ctypes.c_void_p, PTR]
    lib.rl_subsets_shape.restype = None
    lib.rl_subsets_copy.argtypes = [ctypes.c_void_p, PTR, PTR, PTR]
    lib.rl_subsets_copy.restype = None
    lib.rl_subsets_free.argtypes = [ctypes.c_void_p]
    lib.rl_subsets_free.restype = None
    return lib
