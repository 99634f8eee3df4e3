"""An on-disk cache of converted weights, loaded by mmap: a GGUF dequantized or repacked once, not per start.

An entry is two files in our cache folder: `<key>.bin` (the tensors laid end to end, each 64-byte aligned)
and `<key>.json` (the source file's identity, each tensor's dtype / shape / offset, and the caller's extra
record). The key names the source path and the conversion; the identity (size + mtime) is checked on every
read, so a changed source file is converted again and its stale entry replaced. Tensors come back as views
of one private (copy-on-write) map of the .bin: pages are read as the model touches them.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
_ALIGN = 64
_DTYPES = {str(d): d for d in (torch.float32, torch.bfloat16, torch.float16, torch.int8, torch.uint8, torch.int16,
                               torch.int32, torch.int64, torch.bool)}


def cache_dir() -> Path:
    """RADIXLANG_CACHE_DIR, else $XDG_CACHE_HOME/radixlang, else ~/.cache/radixlang."""
    explicit = os.environ.get("RADIXLANG_CACHE_DIR")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "radixlang"


def source_identity(path: Path) -> dict[str, Any]:
    stat = path.stat()
    return {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def entry_key(path: Path, conversion: str) -> str:
    """One entry per source path and conversion (e.g. "auto-float32-AVX512-torch2.13")."""
    digest = hashlib.sha256(f"{path.resolve()}\0{conversion}\0{FORMAT_VERSION}".encode()).hexdigest()[:24]
    return f"{path.stem[:40]}-{digest}"


def load_entry(key: str, identity: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
    """(tensors, extra) of a valid entry, or None when it is missing or its source changed."""
    index_path, data_path = cache_dir() / f"{key}.json", cache_dir() / f"{key}.bin"
    try:
        index = json.loads(index_path.read_text())
    except (OSError, ValueError):
        return None
    if index.get("identity") != identity or index.get("version") != FORMAT_VERSION or not data_path.exists():
        return None
    size = data_path.stat().st_size
    if size != index["bytes"]:
        return None
    raw = torch.from_file(str(data_path), shared=False, size=size, dtype=torch.uint8) if size else torch.empty(0)
    tensors = {}
    for name, (dtype, shape, offset) in index["tensors"].items():
        dt = _DTYPES[dtype]
        count = 1
        for dim in shape:
            count *= dim
        nbytes = count * dt.itemsize
        tensors[name] = raw[offset:offset + nbytes].view(dt).view(shape)
    return tensors, index["extra"]


def save_entry(key: str, identity: dict[str, Any], tensors: dict[str, torch.Tensor], extra: dict[str, Any]) -> None:
    """Writes the entry atomically (a temporary file renamed into place), replacing an older one."""
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    layout, offset = {}, 0
    for name, t in tensors.items():
        offset = -(-offset // _ALIGN) * _ALIGN
        layout[name] = (str(t.dtype), list(t.shape), offset)
        offset += t.numel() * t.element_size()
    with tempfile.NamedTemporaryFile(dir=folder, suffix=".part", delete=False) as f:
        for name, t in tensors.items():
            f.seek(layout[name][2])
            # an ndarray is a buffer (numpy's stubs say so only from Python 3.12); written without a copy
            f.write(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())  # type: ignore[call-overload]
        f.truncate(offset)
    index = {"version": FORMAT_VERSION, "identity": identity, "bytes": offset, "tensors": layout, "extra": extra}
    os.replace(f.name, folder / f"{key}.bin")
    _write_atomically(folder / f"{key}.json", json.dumps(index))


def try_save_entry(key: str, identity: dict[str, Any], tensors: dict[str, torch.Tensor],
                   extra: dict[str, Any]) -> None:
    """save_entry, as a cache writes: a read-only or full disk only costs the next load its conversion."""
    try:
        save_entry(key, identity, tensors, extra)
    except OSError as e:
        logger.warning("could not write the weight cache to %s: %s", cache_dir(), e)


def _write_atomically(path: Path, text: str) -> None:
    with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".part", delete=False) as f:
        f.write(text)
    os.replace(f.name, path)
