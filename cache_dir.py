"""radixlang's cache folder, what is in it, and its bound.

One folder holds everything radixlang keeps between runs: converted weights (runtime/models/loading/weight_cache.py:
`<key>.bin` + `<key>.json`), torch.compile's artefacts (`inductor/`, with a marker per compiled model), the
native CPU kernels (`kernels/`) and small measurements (`cpu_paths*.json`). It is RADIXLANG_CACHE_DIR, else
$XDG_CACHE_HOME/radixlang, else ~/.cache/radixlang.

Weight entries are the big ones (a 100 MB GGUF converts to ~0.5 GB), so they are bounded: after each write,
entries that can never be read again (an older format version, a source file that is gone or changed, files a
killed writer left) are removed; then the least recently used ones over the bound: for each source file, twice
its largest entry (the layout in use and one more), or, when RADIXLANG_CACHE_MAX_BYTES is set, that many bytes
for all of them together. The entry just written stays whatever its size. An entry's last use is its index's mtime, touched on every load. Removing
an entry another process has mapped is safe: the mapping keeps its pages until it is closed.

This module imports nothing of radixlang's and no torch: `radixlang cache ls` is instant, and every layer
may use it.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

# part of every weight entry's key and index: entries of another version are never read, so they are removed.
# History is in runtime/models/loading/weight_cache.py, which writes this version
WEIGHT_FORMAT_VERSION = 2
MAX_BYTES_ENV = "RADIXLANG_CACHE_MAX_BYTES"
DEFAULT_BOUND_ENTRIES = 2  # a source file's entries take at most this many times its largest entry
ABANDONED_AFTER_S = 3600.0  # a temporary (.part) file or an index-less .bin this old is a dead writer's
KINDS = ("weights", "compile", "kernels", "other")


def cache_dir() -> Path:
    """RADIXLANG_CACHE_DIR, else $XDG_CACHE_HOME/radixlang, else ~/.cache/radixlang."""
    explicit = os.environ.get("RADIXLANG_CACHE_DIR")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "radixlang"


@dataclass(frozen=True, slots=True)
class Entry:
    kind: str  # one of KINDS
    name: str  # a weight entry's key, or the file or folder name
    paths: tuple[Path, ...]  # what removing it deletes
    bytes: int
    last_used: float  # seconds since the epoch
    source: str | None = None  # a weight entry's source file
    stale: str | None = None  # why it can never be used again, if so


def entries(folder: Path | None = None, now: float | None = None) -> list[Entry]:
    """Everything in the cache folder, as entries: weight entries, the compile cache, each kernel, the rest."""
    folder = cache_dir() if folder is None else folder
    if not folder.is_dir():
        return []
    now = time.time() if now is None else now
    found: list[Entry] = []
    claimed: set[Path] = set()
    for index in sorted(folder.glob("*.json")):
        weight = _weight_entry(index)
        if weight is not None:
            found.append(weight)
            claimed.update(weight.paths)
    for path in sorted(folder.iterdir()):
        if path in claimed:
            continue
        if path.is_dir():
            kind = {"inductor": "compile", "kernels": "kernels"}.get(path.name, "other")
            if kind == "kernels":
                found += [_file_entry("kernels", p) for p in sorted(path.iterdir())]
            else:
                found.append(Entry(kind, path.name + "/", (path,), _tree_bytes(path), _tree_mtime(path)))
        elif path.suffix in (".bin", ".part"):  # a weight entry's data without its index, or a writer's temporary
            entry = _file_entry("weights", path)
            abandoned = now - entry.last_used > ABANDONED_AFTER_S
            found.append(_with(entry, stale="left by an interrupted write" if abandoned else None))
        else:
            found.append(_file_entry("other", path))
    return found


def _weight_entry(index: Path) -> Entry | None:
    """The weight entry `index` describes, or None when it is no weight cache index."""
    try:
        record = json.loads(index.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or "identity" not in record or "version" not in record:
        return None
    data = index.with_suffix(".bin")
    size = data.stat().st_size if data.exists() else 0
    identity = record.get("identity") or {}
    source = identity.get("path")
    stale = None
    if record["version"] != WEIGHT_FORMAT_VERSION:
        stale = f"format version {record['version']} (this radixlang reads {WEIGHT_FORMAT_VERSION})"
    elif not data.exists() or size != record.get("bytes"):
        stale = "its data file is missing or truncated"
    elif not _source_unchanged(identity):
        stale = "its source file is gone or changed"
    return Entry("weights", index.stem, (index, data), size + index.stat().st_size, index.stat().st_mtime,
                 source, stale)


def _source_unchanged(identity: dict) -> bool:
    try:
        stat = Path(identity["path"]).stat()
    except (OSError, KeyError, TypeError):
        return False
    return stat.st_size == identity.get("size") and stat.st_mtime_ns == identity.get("mtime_ns")


def _file_entry(kind: str, path: Path) -> Entry:
    stat = path.stat()
    return Entry(kind, path.name, (path,), stat.st_size, stat.st_mtime)


def _with(entry: Entry, stale: str | None) -> Entry:
    return Entry(entry.kind, entry.name, entry.paths, entry.bytes, entry.last_used, entry.source, stale)


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _tree_mtime(path: Path) -> float:
    return max((p.stat().st_mtime for p in path.rglob("*") if p.is_file()), default=path.stat().st_mtime)


def remove(entry: Entry) -> None:
    for path in entry.paths:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def max_weight_bytes() -> int | None:
    """RADIXLANG_CACHE_MAX_BYTES (a number of bytes, or with a K/M/G suffix): a bound on all weight entries
    together, which replaces the per-model one; None when unset."""
    explicit = os.environ.get(MAX_BYTES_ENV)
    return parse_bytes(explicit) if explicit else None


def parse_bytes(text: str) -> int:
    units = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    value = text.strip().upper().removesuffix("B").removesuffix("I")
    try:
        if value and value[-1] in units:
            return int(float(value[:-1]) * units[value[-1]])
        return int(value)
    except ValueError:
        raise ValueError(f"{MAX_BYTES_ENV} must be a size in bytes, e.g. 2000000000 or 2G; got {text!r}") from None


def prune(folder: Path | None = None, keep: frozenset[str] = frozenset(), max_bytes: int | None = None,
          now: float | None = None) -> list[Entry]:
    """Removes stale weight entries, then the least recently used ones over the bound: a cap on them all
    (`max_bytes`, default RADIXLANG_CACHE_MAX_BYTES) when one is set, else DEFAULT_BOUND_ENTRIES times each source
    file's largest entry, per source (one model's layouts never evict another model's). Entries named in `keep`
    (keys) stay. Returns what it removed."""
    weights = [e for e in entries(folder, now) if e.kind == "weights"]
    removed = [e for e in weights if e.stale is not None and e.name not in keep]
    live = [e for e in weights if e.stale is None and e.source is not None]  # not a write under way
    cap = max_weight_bytes() if max_bytes is None else max_bytes
    groups: dict[str | None, list[Entry]] = {}
    for entry in live:
        groups.setdefault(None if cap is not None else entry.source, []).append(entry)
    for group in groups.values():
        budget = cap if cap is not None else DEFAULT_BOUND_ENTRIES * max(e.bytes for e in group)
        used = 0
        for entry in sorted(group, key=lambda e: -e.last_used):  # most recently used first
            used += entry.bytes
            if used > budget and entry.name not in keep:
                removed.append(entry)
                used -= entry.bytes
    for entry in removed:
        remove(entry)
    return removed


def clear(folder: Path | None = None, kinds: list[str] | None = None) -> list[Entry]:
    """Removes every entry (of `kinds`, default all); returns them."""
    chosen = [e for e in entries(folder) if kinds is None or e.kind in kinds]
    for entry in chosen:
        remove(entry)
    return chosen


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"  # not reached


def render_listing(found: list[Entry], folder: Path | None = None) -> str:
    """`radixlang cache ls`: one line per entry (kind, size, last use, name, and why it is stale), a total."""
    folder = cache_dir() if folder is None else folder
    lines = [f"{folder}  ({human_bytes(sum(e.bytes for e in found))} in {len(found)} entries)"]
    for e in sorted(found, key=lambda e: (KINDS.index(e.kind), -e.last_used)):
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.last_used))
        note = f"  [stale: {e.stale}]" if e.stale else (f"  <- {e.source}" if e.source else "")
        lines.append(f"{e.kind:<8} {human_bytes(e.bytes):>9}  {used}  {e.name}{note}")
    return "\n".join(lines)
