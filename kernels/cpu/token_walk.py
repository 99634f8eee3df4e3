"""The native trie walk of token masks (token_walk.c), a plain C library loaded with ctypes.

A cold token mask is one walk of the vocabulary trie from a DFA state. numpy walks it a level at a time
(runtime/constrained/masks/token_index.py), ~15 array calls per level: 100 us for a sparse state, milliseconds
for a dense one. In C the walk costs its live prefixes (a few microseconds), and a dense state's loop is
skipped (token_walk.c says how).

The library is built and loaded by c_library (compiled at first use, cached by source hash). No compiler, a failed
build, or RADIXLANG_NATIVE_MASKS=0: `library()` is None and masks take the numpy walk (same masks, slower).
"""
from __future__ import annotations

import ctypes
import functools
import logging

from .c_library import PTR as _PTR
from .c_library import N as _N
from .c_library import load


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded library, built on first call; None where it cannot be (the numpy walk is used). Its
    functions take arrays as addresses (c_library.address): C-contiguous, of the dtypes token_walk.c names."""
    lib = load("token_walk.c")
    if lib is None:
        return None
    lib.rl_trie_bytes.argtypes = [_N, _PTR, _PTR, _PTR, _PTR, _PTR]
    lib.rl_trie_bytes.restype = None
    lib.rl_tokens_within.argtypes = [_PTR, _PTR, _N, _PTR, _PTR, _PTR, _PTR, _N, _PTR, _PTR]
    lib.rl_tokens_within.restype = ctypes.c_int64
    lib.rl_start_loops.argtypes = [ctypes.c_int32, _PTR, _N, _PTR, _PTR, _PTR]
    lib.rl_start_loops.restype = ctypes.c_int64
    lib.rl_start_run.argtypes = [ctypes.c_int32, _PTR, _N, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR]
    lib.rl_start_run.restype = ctypes.c_int64
    lib.rl_skip_set.argtypes = [_PTR, ctypes.c_int32, _N, _N, _N, _N, _PTR]
    lib.rl_skip_set.restype = ctypes.c_int64
    lib.rl_walk_args.argtypes = [_PTR, ctypes.c_int32, _PTR, _PTR, _N, _PTR, _N, _PTR, _N]
    lib.rl_walk_args.restype = ctypes.c_int64
    lib.rl_walk_rows.argtypes = [_N, _PTR, _PTR, _N, _PTR, _PTR, _N, _PTR, ctypes.c_int32, _PTR, _PTR, _PTR, _PTR]
    lib.rl_walk_rows.restype = None
    lib.rl_walk_plain.argtypes = [_PTR, ctypes.c_int32, _N, _N, _N, _N, _N, _PTR, _N, _N, _PTR, _N]
    lib.rl_walk_plain.restype = ctypes.c_int64
    lib.rl_region.argtypes = [_PTR, ctypes.c_int32, _N, _N, _N, _PTR, _PTR, _PTR]
    lib.rl_region.restype = ctypes.c_int64
    lib.rl_signature.argtypes = [_PTR, ctypes.c_int32, _N, _N, _PTR, _PTR]
    lib.rl_signature.restype = ctypes.c_int64
    lib.rl_dense_split.argtypes = [_PTR, _PTR, _PTR, _PTR, _N, _PTR, _PTR, _PTR, _N, _PTR, _PTR, _N, _PTR, _N, _N, _N,
                                   _PTR, _PTR, _PTR, _PTR, _PTR, _PTR]
    lib.rl_dense_split.restype = ctypes.c_int64
    lib.rl_walk_candidates.argtypes = [_PTR, ctypes.c_int32, _N, _PTR, _PTR, _PTR, _PTR, _N, _PTR, _N]
    lib.rl_walk_candidates.restype = ctypes.c_int64
    return lib


if __name__ == "__main__":  # `make install`: build (or find) the library now
    logging.basicConfig(level=logging.INFO)
    print("token walk: " + ("ready" if library() is not None else "unavailable; token masks take the numpy walk"))
    from . import fsa
    print("automata loops: " + ("ready" if fsa.library() is not None else "unavailable; regexes determinize in Python"))
