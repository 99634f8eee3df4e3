"""fsa.py's loops in C (fsa.c): the subset construction, trim's backward reach, minimization's finite classes
and its partition refinement (Hopcroft's); a plain C library loaded with ctypes (built by c_library).

runtime/constrained/regex/native_fsa.py lays automata out as the arrays it reads; without the library (no
compiler, RADIXLANG_NATIVE_MASKS=0) fsa.py takes its Python paths, to the same DFAs.
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
    (c_library.address), C-contiguous, of the dtypes fsa.c names."""
    lib = load("fsa.c")
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
    lib.rl_live.argtypes = [N, N, PTR, PTR, PTR]
    lib.rl_live.restype = N
    lib.rl_finite_classes.argtypes = [N, N, PTR, PTR, PTR]
    lib.rl_finite_classes.restype = N
    lib.rl_refine.argtypes = [N, N, PTR, PTR, PTR]
    lib.rl_refine.restype = N
    lib.rl_shift_rows.argtypes = [N, PTR, PTR, ctypes.c_int32]
    lib.rl_shift_rows.restype = None
    lib.rl_shift_columns.argtypes = [N, PTR, N, PTR, N, PTR, ctypes.c_int32]
    lib.rl_shift_columns.restype = None
    lib.rl_shift_rows_at.argtypes = [N, PTR, PTR, N, PTR, N, PTR, ctypes.c_int32]
    lib.rl_shift_rows_at.restype = None
    lib.rl_distances.argtypes = [N, N, PTR, ctypes.c_int32, PTR, PTR]
    lib.rl_distances.restype = N
    return lib
