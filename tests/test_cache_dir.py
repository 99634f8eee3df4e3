"""The cache folder: stale weight entries go, the rest is bounded by least recent use, and `radixlang cache`
lists and clears it. Small fake entries, written as the weight cache writes them."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

from radixlang import cache_dir
from radixlang.runtime.models.loading import weight_cache
from radixlang.server.cli import main


@pytest.fixture
def folder(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("RADIXLANG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(cache_dir.MAX_BYTES_ENV, raising=False)
    return tmp_path / "cache"


def _source(tmp_path: Path, name: str, size: int = 100) -> Path:
    path = tmp_path / f"{name}.gguf"
    path.write_bytes(b"x" * size)
    return path


def _write(source: Path, conversion: str, nbytes: int, used: float) -> str:
    """A real weight entry of `nbytes` data bytes, last used at `used` (seconds since the epoch)."""
    key = weight_cache.entry_key(source, conversion)
    weight_cache.save_entry(key, weight_cache.source_identity(source), {"w": torch.zeros(nbytes, dtype=torch.uint8)}, {})
    os.utime(cache_dir.cache_dir() / f"{key}.json", (used, used))
    return key


def _keys(folder: Path) -> set[str]:
    return {p.stem for p in folder.glob("*.json")}


def test_cache_dir_is_the_env_folder_else_xdg_else_home(monkeypatch, tmp_path):
    monkeypatch.setenv("RADIXLANG_CACHE_DIR", str(tmp_path / "a"))
    assert cache_dir.cache_dir() == tmp_path / "a"
    monkeypatch.delenv("RADIXLANG_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir.cache_dir() == tmp_path / "xdg" / "radixlang"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir.cache_dir() == Path.home() / ".cache" / "radixlang"
    assert weight_cache.cache_dir is cache_dir.cache_dir  # one definition


def test_least_recently_used_entries_go_first_down_to_the_bound(folder, tmp_path):
    now = time.time()
    src = _source(tmp_path, "m")
    oldest = _write(src, "a", 1000, now - 300)
    middle = _write(src, "b", 1000, now - 200)
    newest = _write(src, "c", 1000, now - 100)
    sizes = {e.name: e.bytes for e in cache_dir.entries(folder)}
    # room for two entries of the three: only the least recently used goes
    removed = cache_dir.prune(folder, max_bytes=sizes[middle] + sizes[newest])
    assert [e.name for e in removed] == [oldest] and _keys(folder) == {middle, newest}
    # an entry kept by name stays even when it alone is over the bound
    cache_dir.prune(folder, keep=frozenset({middle}), max_bytes=1)
    assert _keys(folder) == {middle}
    assert sorted(p.name for p in folder.iterdir()) == [f"{middle}.bin", f"{middle}.json"]


def test_a_load_counts_as_a_use(folder, tmp_path):
    now = time.time()
    src = _source(tmp_path, "m")
    first = _write(src, "a", 1000, now - 300)
    second = _write(src, "b", 1000, now - 200)
    assert weight_cache.load_entry(first, weight_cache.source_identity(src)) is not None  # now the newest
    cache_dir.prune(folder, max_bytes=1500)
    assert _keys(folder) == {first} and second not in _keys(folder)


def test_by_default_each_models_entries_take_at_most_twice_its_largest(folder, tmp_path, monkeypatch):
    now = time.time()
    src, other = _source(tmp_path, "m"), _source(tmp_path, "other")
    keys = [_write(src, c, 1000, now - 100 * (4 - i)) for i, c in enumerate("abc")]
    others = {_write(other, c, 1000, now - 1000 - i) for i, c in enumerate("ab")}  # older than all of m's
    cache_dir.prune(folder)  # m: three entries of one size, room for two; `other`: two, within its own bound
    assert _keys(folder) == set(keys[1:]) | others
    monkeypatch.setenv(cache_dir.MAX_BYTES_ENV, "1K")
    assert cache_dir.max_weight_bytes() == 1024
    cache_dir.prune(folder)
    assert _keys(folder) == set()  # each entry is over 1 KB: none fits the cap
    monkeypatch.setenv(cache_dir.MAX_BYTES_ENV, "lots")
    with pytest.raises(ValueError, match="RADIXLANG_CACHE_MAX_BYTES"):
        cache_dir.prune(folder)


def test_the_cap_evicts_across_models_least_recently_used_first(folder, tmp_path, monkeypatch):
    now = time.time()
    old = _write(_source(tmp_path, "old"), "a", 1000, now - 300)
    new = _write(_source(tmp_path, "new"), "a", 1000, now - 100)
    sizes = {e.name: e.bytes for e in cache_dir.entries(folder)}
    monkeypatch.setenv(cache_dir.MAX_BYTES_ENV, str(sizes[new] + 10))
    assert [e.name for e in cache_dir.prune(folder)] == [old] and _keys(folder) == {new}


def test_a_write_prunes_the_folder_and_keeps_what_it_wrote(folder, tmp_path, monkeypatch):
    now = time.time()
    src = _source(tmp_path, "m")
    old = _write(src, "a", 1000, now - 100)
    monkeypatch.setenv(cache_dir.MAX_BYTES_ENV, "1500")
    key = weight_cache.entry_key(src, "b")
    weight_cache.try_save_entry(key, weight_cache.source_identity(src), {"w": torch.ones(1000, dtype=torch.uint8)}, {})
    assert _keys(folder) == {key} and old not in _keys(folder)


def test_stale_entries_go_whatever_the_bound(folder, tmp_path):
    now = time.time()
    kept_src, gone_src, changed_src = (_source(tmp_path, n) for n in ("kept", "gone", "changed"))
    kept = _write(kept_src, "a", 10, now)
    gone = _write(gone_src, "a", 10, now)
    changed = _write(changed_src, "a", 10, now)
    old_version = _write(kept_src, "b", 10, now)
    index = folder / f"{old_version}.json"
    index.write_text(json.dumps(json.loads(index.read_text()) | {"version": cache_dir.WEIGHT_FORMAT_VERSION - 1}))
    gone_src.unlink()
    changed_src.write_bytes(b"y" * 5)
    abandoned = folder / f"{kept}.123.abc.part"
    abandoned.write_bytes(b"z")
    os.utime(abandoned, (now - 2 * cache_dir.ABANDONED_AFTER_S,) * 2)
    fresh_part = folder / f"{kept}.456.def.part"  # a write under way now
    fresh_part.write_bytes(b"z")
    stale = {e.name: e.stale for e in cache_dir.entries(folder) if e.stale}
    assert set(stale) == {gone, changed, old_version, abandoned.name}
    assert "format version" in stale[old_version] and "gone or changed" in stale[gone]
    cache_dir.prune(folder, max_bytes=10**9)
    assert _keys(folder) == {kept} and fresh_part.exists() and not abandoned.exists()
    cache_dir.prune(folder, max_bytes=1)  # a cap nothing fits: a write under way is still left alone
    assert fresh_part.exists() and not _keys(folder)


def test_cache_ls_and_clear(folder, tmp_path, capsys):
    src = _source(tmp_path, "model")
    key = _write(src, "a", 2048, time.time())
    (folder / "kernels").mkdir()
    (folder / "kernels" / "block_mm-abc.so").write_bytes(b"k" * 10)
    (folder / "inductor").mkdir()
    (folder / "inductor" / "x.py").write_bytes(b"c" * 30)
    assert main(["cache", "ls"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(str(folder)) and "in 3 entries" in out[0]
    weights = next(line for line in out if key in line)
    assert weights.split()[0] == "weights" and str(src.resolve()) in weights and weights.split()[2] == "KB"
    assert any(line.split()[0] == "compile" and "inductor/" in line for line in out)
    assert main(["cache", "clear", "--kind", "compile"]) == 0
    assert not (folder / "inductor").exists() and (folder / f"{key}.bin").exists()
    assert main(["cache", "clear"]) == 0
    assert "removed 2 entries" in capsys.readouterr().out.splitlines()[-1]
    assert list(folder.iterdir()) == [folder / "kernels"]  # the (empty) folder of its kind stays


def test_cache_prune_removes_what_a_write_would(folder, tmp_path, capsys):
    now = time.time()
    src, gone = _source(tmp_path, "m"), _source(tmp_path, "gone")
    keys = [_write(src, c, 1000, now - 100 * (4 - i)) for i, c in enumerate("abc")]
    stale = _write(gone, "a", 1000, now)
    gone.unlink()
    assert main(["cache", "prune"]) == 0
    assert "removed 2 entries" in capsys.readouterr().out  # the stale one, and m's oldest over twice its largest
    assert _keys(folder) == set(keys[1:]) and stale not in _keys(folder)


def test_cache_with_an_unknown_action_prints_its_own_usage(capsys):
    with pytest.raises(SystemExit):
        main(["cache", "ls", "--bogus"])
    assert capsys.readouterr().err.startswith("usage: radixlang cache ls")
