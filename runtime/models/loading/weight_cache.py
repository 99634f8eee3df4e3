"""An on-disk cache of converted weights, loaded by mmap: a GGUF dequantized or repacked once, not per start.

An entry is two files in our cache folder: `<key>.bin` (the tensors laid end to end, each 64-byte aligned)
and `<key>.json` (the source file's identity, each tensor's dtype / shape / offset, and the caller's extra
record). The key names the source path and the conversion; the identity (size + mtime) is checked on every
read, so a changed source file is converted again and its stale entry replaced. Tensors come back as views
of one private (copy-on-write) map of the .bin: pages are read as the model touches them.

A converting process writes its entry on a background thread (save_entry_in_background) while it starts
serving. Each file is written under a temporary name (`<key>.<pid>.<random>.part`) and renamed into place,
the .bin before the .json that points at it, so another process sees a whole entry or none. The thread is
joined at interpreter exit, so a short run still leaves its entry; a killed writer leaves only .part files,
which the next write of that key removes.
"""
from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import logging
import os
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Protocol

import torch

from ....cache_dir import WEIGHT_FORMAT_VERSION, cache_dir, prune

logger = logging.getLogger(__name__)

# part of every key: a version's entries are never read by another. 2: "auto" entries hold the block kernel's
# BlockLinear records, or int4pack ones that keep their blocks (version 1's int4pack entries have none: read
# by this code they would keep a machine on int4pack after the kernel is built; read by version-1 code,
# a BlockLinear record is a KeyError)
FORMAT_VERSION = WEIGHT_FORMAT_VERSION  # (the cache folder's module removes entries of other versions)
_ALIGN = 64
# key -> the thread writing that entry in this process, and the event that tells it the entry is needed now
_writes: dict[str, tuple[threading.Thread, threading.Event]] = {}
_writes_lock = threading.Lock()
_DTYPES = {str(d): d for d in (torch.float32, torch.bfloat16, torch.float16, torch.int8, torch.uint8, torch.int16,
                               torch.int32, torch.int64, torch.bool)}


def source_identity(path: Path) -> dict[str, Any]:
    stat = path.stat()
    return {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def entry_key(path: Path, conversion: str) -> str:
    """One entry per source path and conversion (e.g. "auto-float32-AVX512-torch2.13")."""
    digest = hashlib.sha256(f"{path.resolve()}\0{conversion}\0{FORMAT_VERSION}".encode()).hexdigest()[:24]
    return f"{path.stem[:40]}-{digest}"


def load_entry(key: str, identity: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
    """(tensors, extra) of a valid entry, or None when it is missing or its source changed. Waits for this
    process's own write of the entry, if one is under way."""
    wait_for_write(key)
    index_path, data_path = cache_dir() / f"{key}.json", cache_dir() / f"{key}.bin"
    try:
        index = json.loads(index_path.read_text())
    except (OSError, ValueError):
        return None
    if index.get("identity") != identity or index.get("version") != FORMAT_VERSION or not data_path.exists():
        return None
    try:  # another process's LRU bound may remove the entry at any moment: then it is missing, as above
        size = data_path.stat().st_size
        if size != index["bytes"]:
            return None
        with contextlib.suppress(OSError):  # its last use, which the cache's LRU bound reads (a read-only cache: none)
            os.utime(index_path)
        raw = torch.from_file(str(data_path), shared=False, size=size, dtype=torch.uint8) if size else torch.empty(0)
    except (OSError, RuntimeError):  # torch reports a vanished file as a RuntimeError
        return None
    tensors = {}
    for name, (dtype, shape, offset) in index["tensors"].items():
        dt = _DTYPES[dtype]
        count = 1
        for dim in shape:
            count *= dim
        nbytes = count * dt.itemsize
        tensors[name] = raw[offset:offset + nbytes].view(dt).view(shape)
    return tensors, index["extra"]


def save_entry(key: str, identity: dict[str, Any], tensors: dict[str, torch.Tensor], extra: dict[str, Any],
               folder: Path | None = None) -> None:
    """Writes the entry atomically (a temporary file renamed into place), replacing an older one, in `folder`
    (default: cache_dir())."""
    folder = cache_dir() if folder is None else folder
    folder.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_parts(folder, key)
    layout, offset = {}, 0
    for name, t in tensors.items():
        offset = -(-offset // _ALIGN) * _ALIGN
        layout[name] = (str(t.dtype), list(t.shape), offset)
        offset += t.numel() * t.element_size()
    with tempfile.NamedTemporaryFile(dir=folder, prefix=_part_prefix(key), suffix=".part", delete=False) as f:
        for name, t in tensors.items():
            f.seek(layout[name][2])
            # an ndarray is a buffer (numpy's stubs say so only from Python 3.12); written without a copy
            f.write(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())  # type: ignore[call-overload]
        f.truncate(offset)
    index = {"version": FORMAT_VERSION, "identity": identity, "bytes": offset, "tensors": layout, "extra": extra}
    os.replace(f.name, folder / f"{key}.bin")
    _write_atomically(folder / f"{key}.json", json.dumps(index), key)


def try_save_entry(key: str, identity: dict[str, Any], tensors: dict[str, torch.Tensor],
                   extra: dict[str, Any], folder: Path | None = None) -> None:
    """save_entry, as a cache writes: a read-only or full disk only costs the next load its conversion. Then the
    folder is pruned to its bound (cache_dir.prune), this entry kept."""
    try:
        save_entry(key, identity, tensors, extra, folder)
        removed = prune(folder, keep=frozenset({key}))
    except (OSError, ValueError) as e:  # ValueError: a malformed RADIXLANG_CACHE_MAX_BYTES
        logger.warning("could not write the weight cache to %s: %s", folder or cache_dir(), e)
        return
    if removed:
        logger.info("weight cache: removed %d old entries (%.0f MB) from %s", len(removed),
                    sum(e.bytes for e in removed) / 2**20, folder or cache_dir())


class Idleness(Protocol):
    def idle_seconds(self) -> float: ...


# the process's engines (their scheduler threads), which the background writes wait for (write_when_idle)
_engines: weakref.WeakSet[Idleness] = weakref.WeakSet()
WRITE_AFTER_IDLE_S = 1.0  # a write starts once every engine has had no request this long,
WRITE_START_LATEST_S = 60.0  # or this long after the load at the latest (a server under constant load)
ENGINE_GRACE_S = 3.0  # how long a write waits for an engine to register before it writes anyway


def write_when_idle(engine: Idleness) -> None:
    """Background writes of this process wait until `engine` (and every other registered one) has been idle for
    WRITE_AFTER_IDLE_S: a cold start's first requests then run on both cores."""
    _engines.add(engine)


def _wait_until_quiet(started: float, needed: threading.Event) -> None:
    """Returns once the engines are idle, the main thread has ended (the interpreter joins this writer at exit:
    the write then runs at once), wait_for_write needs the entry (`needed`), or WRITE_START_LATEST_S has passed."""
    while threading.main_thread().is_alive() and not needed.is_set():
        waited = time.monotonic() - started
        engines = list(_engines)
        if waited >= WRITE_START_LATEST_S or (not engines and waited >= ENGINE_GRACE_S):
            return
        if engines and all(e.idle_seconds() >= WRITE_AFTER_IDLE_S for e in engines):
            return
        time.sleep(0.05)


def _save_at_low_priority(key: str, identity: dict[str, Any], tensors: dict[str, torch.Tensor],
                          extra: dict[str, Any], folder: Path, needed: threading.Event) -> None:
    """try_save_entry once the engines are idle, from a thread niced to 19 (Linux niceness is per thread): the copy
    of ~0.5 GB into the page cache, and the kernel's writeback of it, took a core while a cold start's first
    request ran, whose first token came 0.9-1.9 s after `Engine()` instead of 0.03 s."""
    started = time.monotonic()
    if sys.platform == "linux":
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    _wait_until_quiet(started, needed)
    try_save_entry(key, identity, tensors, extra, folder)


def save_entry_in_background(key: str, identity: dict[str, Any], tensors: dict[str, torch.Tensor],
                             extra: dict[str, Any]) -> threading.Thread:
    """try_save_entry on a thread of its own, so that a converting start does not wait for the disk. The
    tensors must not change while it runs (a model's weights do not); the folder is cache_dir() as of this
    call. Not a daemon: the interpreter joins it at exit, so a one-shot run still leaves its entry."""
    wait_for_write(key)
    needed = threading.Event()
    thread = threading.Thread(target=_save_at_low_priority,
                              args=(key, identity, tensors, extra, cache_dir(), needed),
                              name="radixlang-weight-cache-write")
    with _writes_lock:
        _writes[key] = (thread, needed)
    thread.start()
    return thread


def wait_for_write(key: str | None = None) -> None:
    """Joins this process's background write of entry `key` (None: of every entry)."""
    with _writes_lock:
        writes = list(_writes.values()) if key is None else [w for k, w in _writes.items() if k == key]
    for thread, needed in writes:
        needed.set()  # the caller needs the entry now: no waiting for idle engines
        thread.join()
    with _writes_lock:
        for k, (thread, _) in list(_writes.items()):
            if not thread.is_alive():
                del _writes[k]


def _part_prefix(key: str) -> str:
    return f"{key}.{os.getpid()}."


def _remove_abandoned_parts(folder: Path, key: str) -> None:
    """Deletes the temporary files of `key` left by writers that died (their pid no longer runs)."""
    for part in folder.glob(f"{glob.escape(key)}.*.part"):
        pid = part.name[len(key) + 1:].split(".")[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _running(int(pid)):
            part.unlink(missing_ok=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _write_atomically(path: Path, text: str, key: str) -> None:
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=_part_prefix(key), suffix=".part",
                                     delete=False) as f:
        f.write(text)
    os.replace(f.name, path)
