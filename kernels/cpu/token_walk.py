"""The native trie walk of token masks (token_walk.c), a plain C library loaded with ctypes.

A cold token mask is one walk of the vocabulary trie from a DFA state. numpy walks it a level at a time
(runtime/constrained/masks/token_index.py), ~15 array calls per level: 100 us for a sparse state, milliseconds
for a dense one. In C the walk costs its live prefixes (a few microseconds), and a dense state's loop is
skipped (token_walk.c says how).

The library is compiled here with the system C compiler (`cc -O2`, well under a second) at first use, kept in
the cache folder (RADIXLANG_KERNEL_DIR, else cache_dir()/kernels) under a hash of the source and the compiler's
version, built to a temporary name then renamed. No compiler, a failed build, or RADIXLANG_NATIVE_MASKS=0:
`library()` is None and masks take the numpy walk (same masks, slower).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("token_walk.c")
FLAGS = ("-O2", "-shared", "-fPIC", "-std=c11")
_lock = threading.Lock()

_PTR = ctypes.c_void_p  # arrays pass as their addresses (numpy's ndpointer checks cost ~10 us per argument)
_N = ctypes.c_int64


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def _build(compiler: str) -> Path:
    from ...cache_dir import cache_dir

    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
    key = hashlib.sha256("\n".join([SOURCE.read_text(), " ".join(FLAGS), compiler, version]).encode()).hexdigest()[:16]
    path = Path(os.environ.get("RADIXLANG_KERNEL_DIR") or cache_dir() / "kernels") / f"token_walk-{key}.so"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        done = subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", str(tmp)], capture_output=True, text=True,
                              timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{compiler} failed ({done.returncode}): {done.stderr[-2000:]}")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded library, built on first call; None where it cannot be (the numpy walk is used). Its
    functions take arrays as addresses (`address`): C-contiguous, of the dtypes token_walk.c names."""
    if os.environ.get("RADIXLANG_NATIVE_MASKS", "1") == "0":
        return None
    compiler = _compiler()
    if compiler is None:
        logger.info("no C compiler: token masks take the numpy walk")
        return None
    with _lock:
        try:
            lib = ctypes.CDLL(str(_build(compiler)))
        except (OSError, RuntimeError, subprocess.SubprocessError) as e:
            logger.warning("the native token walk did not build (%s): token masks take the numpy walk", e)
            return None
    lib.rl_trie_bytes.argtypes = [_N, _PTR, _PTR, _PTR, _PTR, _PTR]
    lib.rl_trie_bytes.restype = None
    lib.rl_tokens_within.argtypes = [_N, _PTR, _PTR, _PTR, _PTR, _PTR, _N, _PTR]
    lib.rl_tokens_within.restype = None
    lib.rl_walk.argtypes = [_N, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _N, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR,
                            _PTR, _PTR, _PTR, ctypes.c_int32, _PTR, _PTR, _N, _PTR, _N, _PTR, _PTR, _PTR, _PTR, _N, _PTR]
    lib.rl_walk.restype = ctypes.c_int64
    lib.rl_start_loops.argtypes = [ctypes.c_int32, _PTR, _N, _PTR, _PTR, _PTR]
    lib.rl_start_loops.restype = ctypes.c_int64
    lib.rl_start_run.argtypes = [ctypes.c_int32, _PTR, _N, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR]
    lib.rl_start_run.restype = ctypes.c_int64
    lib.rl_skip_set.argtypes = [_PTR, ctypes.c_int32, _N, _N, _N, _PTR]
    lib.rl_skip_set.restype = ctypes.c_int64
    lib.rl_walk_args.argtypes = [_PTR, ctypes.c_int32, _PTR, _PTR, _N, _PTR, _N, _PTR, _N]
    lib.rl_walk_args.restype = ctypes.c_int64
    lib.rl_walk_rows.argtypes = [_N, _PTR, _PTR, _N, _PTR, _PTR, _N, _PTR, ctypes.c_int32, _PTR, _PTR, _PTR, _PTR]
    lib.rl_walk_rows.restype = None
    lib.rl_region.argtypes = [_PTR, ctypes.c_int32, _N, _N, _N, _PTR, _PTR, _PTR]
    lib.rl_region.restype = ctypes.c_int64
    lib.rl_signature.argtypes = [_PTR, ctypes.c_int32, _N, _N, _PTR, _PTR]
    lib.rl_signature.restype = ctypes.c_int64
    return lib


def address(array: np.ndarray | None) -> int | None:
    """A C-contiguous array's address for the library's functions (None: a null pointer)."""
    if array is None:
        return None
    assert array.flags.c_contiguous, "the native walk reads arrays in C order"
    return array.ctypes.data


if __name__ == "__main__":  # `make install`: build (or find) the library now
    logging.basicConfig(level=logging.INFO)
    print("token walk: " + ("ready" if library() is not None else "unavailable; token masks take the numpy walk"))
