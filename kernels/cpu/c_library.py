"""Plain C libraries of this folder (token_walk.c, fsa.c), compiled at first use and loaded with ctypes.

A library is compiled here with the system C compiler (`cc -O2`, well under a second) at first use, kept in the
cache folder (RADIXLANG_KERNEL_DIR, else cache_dir()/kernels) under a hash of the source and the compiler's
version, built to a temporary name then renamed. No compiler, a failed build, or RADIXLANG_NATIVE_MASKS=0:
`load` gives None and the caller takes its Python path (same results, slower).
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

FLAGS = ("-O2", "-shared", "-fPIC", "-std=c11")
_lock = threading.Lock()

PTR = ctypes.c_void_p  # arrays pass as their addresses (numpy's ndpointer checks cost ~10 us per argument)
N = ctypes.c_int64


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def _build(source: Path, compiler: str) -> Path:
    from ...cache_dir import cache_dir

    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
    key = hashlib.sha256("\n".join([source.read_text(), " ".join(FLAGS), compiler, version]).encode()).hexdigest()[:16]
    path = Path(os.environ.get("RADIXLANG_KERNEL_DIR") or cache_dir() / "kernels") / f"{source.stem}-{key}.so"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        done = subprocess.run([compiler, *FLAGS, str(source), "-o", str(tmp)], capture_output=True, text=True,
                              timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{compiler} failed ({done.returncode}): {done.stderr[-2000:]}")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


@functools.cache
def load(name: str) -> ctypes.CDLL | None:
    """The library built from this folder's `name` (a .c file), built on first call; None where it cannot be.
    The caller declares its functions' argument types."""
    if os.environ.get("RADIXLANG_NATIVE_MASKS", "1") == "0":
        return None
    compiler = _compiler()
    if compiler is None:
        logger.info("no C compiler: %s takes its Python path", name)
        return None
    with _lock:
        try:
            return ctypes.CDLL(str(_build(Path(__file__).with_name(name), compiler)))
        except (OSError, RuntimeError, subprocess.SubprocessError) as e:
            logger.warning("%s did not build (%s): its Python path is taken", name, e)
            return None


def address(array: np.ndarray | None) -> int | None:
    """A C-contiguous array's address for a library's functions (None: a null pointer)."""
    if array is None:
        return None
    assert array.flags.c_contiguous, "the native code reads arrays in C order"
    return array.ctypes.data
