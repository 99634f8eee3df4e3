"""A GGUF reader that costs O(fields + tensors) Python steps, not O(vocabulary).

gguf's own GGUFReader builds one numpy view per array element, so the tokenizer's ~100k strings (tokens
and merges) take seconds. Here the file is mapped once; numeric arrays are numpy views of the map, and a
string array is cut out by offsets found with pointer doubling (each string's end is its start + 8 + its
length, so "2^k strings further" tables compose in log2(count) vectorised steps) and decoded in one call.
Tensors are views of the map as well: nothing is copied until a loader converts it.
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

_MAGIC = b"GGUF"
_STRING, _ARRAY = 8, 9
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_F32, _F16, _BF16 = 0, 1, 30
_PLAIN = {_F32: np.float32, _F16: np.float16}  # ggml types with a numpy dtype (BF16 stays raw bytes, as in gguf)
# (weights, bytes) per block of the common ggml types: F32, F16, Q4_0, Q4_1, Q8_0, BF16
_BLOCKS = {_F32: (1, 4), _F16: (1, 2), 2: (32, 18), 3: (32, 20), 8: (32, 34), _BF16: (1, 2)}
_SEPARATOR = 0xFF  # never a byte of valid UTF-8, so it can join the strings of an array
_ESCAPED = re.compile("[\udc80-\udcfe]")  # other invalid bytes, as surrogateescape decodes them


@dataclass(slots=True)
class GGUFTensor:
    name: str
    shape: tuple[int, ...]  # GGUF order: fastest-varying dimension first
    tensor_type: int  # a ggml type id (gguf.GGMLQuantizationType)
    data: np.ndarray  # a read-only view of the file: typed for F32/F16, else uint8 [rows, bytes per row]


@dataclass(slots=True)
class GGUFFile:
    metadata: dict[str, Any]  # numeric arrays are numpy views, string arrays lists of str
    tensors: list[GGUFTensor]


class _Cursor:
    """Reads little-endian values from the mapped file, advancing an offset."""

    def __init__(self, buf: np.ndarray):
        # numpy's stubs give ndarray the buffer protocol only from Python 3.12; it has it on every version
        self.buf, self.view, self.at = buf, memoryview(buf), 0  # type: ignore[arg-type]

    def scalar(self, fmt: str) -> int | float:  # a bool is an int
        (value,) = struct.unpack_from(fmt, self.view, self.at)
        self.at += struct.calcsize(fmt)
        return value

    def count(self, fmt: str = "<Q") -> int:
        """An unsigned integer (`fmt`: "<Q" or "<I"): a length, count, type tag or version."""
        return int(self.scalar(fmt))

    def string(self) -> str:
        size = self.count()
        self.at += size
        return bytes(self.view[self.at - size:self.at]).decode("utf-8")


def read_gguf(path: str | Path) -> GGUFFile:
    buf = np.memmap(path, dtype=np.uint8, mode="r").view(np.ndarray)  # plain views: no memmap per slice
    cur = _Cursor(buf)
    if bytes(cur.view[:4]) != _MAGIC:
        raise ValueError(f"{str(path)!r} is not a GGUF file (bad magic)")
    cur.at = 4
    version = cur.count("<I")
    if version < 2:
        raise ValueError(f"GGUF version {version} of {str(path)!r} is not supported (2 and later are)")
    n_tensors, n_fields = cur.count(), cur.count()
    metadata = {}
    for _ in range(n_fields):
        key = cur.string()
        metadata[key] = _value(cur, cur.count("<I"))
    infos = [_tensor_info(cur) for _ in range(n_tensors)]
    alignment = int(metadata.get("general.alignment", 32))
    start = -(-cur.at // alignment) * alignment
    return GGUFFile(metadata, [_tensor(buf, start, *info) for info in infos])


def _value(cur: _Cursor, kind: int) -> Any:  # noqa: ANN401 - a string, number, bool or array (`kind`)
    if kind == _STRING:
        return cur.string()
    if kind == _ARRAY:
        item, count = cur.count("<I"), cur.count()
        if item == _STRING:
            return _string_array(cur, count)
        if item not in _SCALARS:
            raise ValueError(f"GGUF arrays of type {item} are not supported")
        dtype = np.dtype(_SCALARS[item].replace("?", "b1"))
        array = cur.buf[cur.at:cur.at + count * dtype.itemsize].view(dtype)
        cur.at += count * dtype.itemsize
        return array
    if kind not in _SCALARS:
        raise ValueError(f"GGUF value type {kind} is not supported")
    return cur.scalar(_SCALARS[kind])


def _string_array(cur: _Cursor, count: int) -> list[str]:
    """`count` strings (u64 length + UTF-8 bytes each) from the cursor on, in O(log count) numpy steps."""
    if count == 0:
        return []
    window = min(count * 24 + 4096, len(cur.buf) - cur.at)
    while True:
        starts = _string_starts(cur.buf[cur.at:cur.at + window], count + 1)
        if starts is not None or cur.at + window >= len(cur.buf):
            break
        window = min(window * 2, len(cur.buf) - cur.at)
    if starts is None:
        raise ValueError("GGUF string array runs past the end of the file")
    region = np.array(cur.buf[cur.at:cur.at + starts[-1]])
    keep = np.ones(len(region), dtype=bool)
    keep[(starts[:-1, None] + np.arange(1, 8)).ravel()] = False  # the length's other 7 bytes go
    region[starts[:-1]] = _SEPARATOR  # its first byte separates the strings
    text = region[keep].tobytes().decode("utf-8", "surrogateescape")
    if _ESCAPED.search(text):
        raise ValueError("a GGUF string array holds invalid UTF-8")
    strings = text.split("\udcff")[1:]
    if len(strings) != count:
        raise ValueError("a GGUF string array holds invalid UTF-8")
    cur.at += int(starts[-1])
    return strings


def _string_starts(region: np.ndarray, count: int) -> np.ndarray | None:
    """Offsets of the first `count` strings laid end to end in `region`, the last one being where the
    previous string ends (None: they do not all fit inside it)."""
    size = len(region)
    out = size + 1  # "past the region": every jump from there stays there
    index = np.int32 if size < 2**31 - 16 else np.int64
    nxt = np.full(size + 2, out, dtype=index)
    if size >= 8:
        windows = np.lib.stride_tricks.sliding_window_view(region, 8)  # the 8 bytes at every offset
        lengths = np.ascontiguousarray(windows).view("<u8")[:, 0]
        ends = np.arange(size - 7, dtype=np.int64) + 8 + np.minimum(lengths, size).astype(np.int64)
        nxt[:size - 7] = np.where(ends <= size, ends, out)
    # doubling while the table is squared (log2 of sqrt(count) squarings of the whole table), then blocks of
    # that many strings at a time from the last table: O(sqrt(count)) numpy calls, each cheap
    starts, jump = np.zeros(1, dtype=index), nxt
    while len(starts) < count and len(starts) ** 2 < count:  # invariant: jump[starts[i]] == starts[i + len(starts)]
        starts = np.concatenate([starts, jump[starts]])
        jump = jump[jump]
    blocks = [starts]
    while len(blocks) * len(starts) < count:
        blocks.append(jump[blocks[-1]])
    starts = np.concatenate(blocks)
    starts = starts[:count]
    return None if starts[-1] > size else starts


def _tensor_info(cur: _Cursor) -> tuple[str, tuple[int, ...], int, int]:
    name = cur.string()
    dims = tuple(cur.count() for _ in range(cur.count("<I")))
    return name, dims, cur.count("<I"), cur.count()


def _block_size(kind: int) -> tuple[int, int]:
    """(weights per block, bytes per block) of a ggml type."""
    if kind in _BLOCKS:
        return _BLOCKS[kind]
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType  # the rarer types (~0.1 s to import)

    try:
        return GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
    except (ValueError, KeyError) as e:
        raise ValueError(f"GGUF tensor type {kind} is not known to this gguf package") from e


def _tensor(buf: np.ndarray, start: int, name: str, shape: tuple[int, ...], kind: int, offset: int) -> GGUFTensor:
    block, block_bytes = _block_size(kind)
    elements = int(np.prod(shape))
    at = start + offset
    data = buf[at:at + elements // block * block_bytes]
    torch_order = tuple(reversed(shape))
    if kind in _PLAIN:
        data = data.view(_PLAIN[kind]).reshape(torch_order)
    else:
        data = data.reshape(*torch_order[:-1], shape[0] // block * block_bytes)
    return GGUFTensor(name, shape, kind, data)
