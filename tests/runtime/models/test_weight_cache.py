"""The weight cache's entry is written off the loading thread, and whole or not at all: a process that exits
right after loading leaves a complete entry, one killed while writing leaves none (and its temporary file
goes with the next write)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import weakref

import numpy as np
import pytest
import torch
import transformers

from radixlang.runtime.model_loading import load_model
from radixlang.runtime.models.loading import loader, weight_cache

from .gguf_tiny import Q, gguf_tensors, write_gguf
from .hf_tiny import BASE, save_hf_model

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def no_write_of_another_test():
    """Writes left pending by earlier tests in this worker wait up to ENGINE_GRACE_S for an engine; one that woke
    inside a test below would call its stand-in save_entry (CI once saw two writers where one was due)."""
    weight_cache.wait_for_write()
    yield
    weight_cache.wait_for_write()


@pytest.fixture
def tiny_gguf(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXLANG_CACHE_DIR", str(tmp_path / "cache"))
    config = transformers.LlamaConfig(**(BASE | dict(tie_word_embeddings=True)))
    model = save_hf_model(tmp_path / "hf", config)
    hf = json.loads((tmp_path / "hf" / "config.json").read_text())
    write_gguf(tmp_path / "m.gguf", hf, gguf_tensors(hf, model.state_dict(), Q.Q4_1, np.random.default_rng(0))[0])
    return tmp_path / "m.gguf"


def entry_of(path, mode: str):
    key = weight_cache.entry_key(path, f"{mode}-{torch.float32}-{loader.weight_cache_tag(mode)}")
    return weight_cache.load_entry(key, weight_cache.source_identity(path))


def converted_state(path, mode: str) -> dict[str, torch.Tensor]:
    """The model converted from the file without the cache."""
    model = loader.build_model(*loader._read_gguf(path, blocks := {})[:2], CPU, torch.float32)
    loader.quantize_model(model, mode, blocks)
    return model.state_dict()


def assert_entry_is(entry, want: dict[str, torch.Tensor]) -> None:
    assert entry is not None
    tensors, _ = entry
    assert tensors.keys() == want.keys()
    for name, t in want.items():
        assert tensors[name].dtype == t.dtype and torch.equal(tensors[name], t), name


def test_the_entry_is_written_on_another_thread_after_the_model_is_returned(tiny_gguf, monkeypatch):
    release, writers = threading.Event(), []
    save = weight_cache.save_entry

    def stalled_save(*args):
        writers.append(threading.current_thread())
        niceness.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        release.wait(timeout=10)  # the old, inline write would hold load_model this long
        save(*args)
    niceness: list[int] = []
    monkeypatch.setattr(weight_cache, "save_entry", stalled_save)
    monkeypatch.setattr(weight_cache, "_engines", weakref.WeakSet())  # no engine to wait for,
    monkeypatch.setattr(weight_cache, "ENGINE_GRACE_S", 0.0)  # nor for one to come
    model = load_model(tiny_gguf, CPU, torch.float32, quantization="auto").model
    assert writers and writers[0] is not threading.current_thread() and writers[0].is_alive()
    # the writer yields the cores to the first requests (Linux nices threads one by one; this one stays as it was)
    if sys.platform == "linux":
        assert niceness == [19] and os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) < 19
    release.set()
    assert_entry_is(entry_of(tiny_gguf, "auto"), model.state_dict())  # load_entry waits for the write


def test_a_background_write_waits_until_the_engines_are_idle(tiny_gguf, monkeypatch):
    class Engine:  # what write_when_idle reads of an engine: its scheduler's idle time
        idle = 0.0

        def idle_seconds(self) -> float:
            return self.idle
    engine, written, save = Engine(), threading.Event(), weight_cache.save_entry
    monkeypatch.setattr(weight_cache, "_engines", weakref.WeakSet())
    monkeypatch.setattr(weight_cache, "save_entry", lambda *args: (save(*args), written.set()))
    weight_cache.write_when_idle(engine)
    load_model(tiny_gguf, CPU, torch.float32, quantization="auto")
    assert not written.wait(timeout=1.5)  # a request is running: the write waits
    engine.idle = weight_cache.WRITE_AFTER_IDLE_S
    assert written.wait(timeout=30)


def run_child(code: str, tiny_gguf) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(tiny_gguf)], capture_output=True,
                          text=True, timeout=300, env=os.environ.copy())


def test_a_process_that_exits_right_after_loading_leaves_a_complete_entry(tiny_gguf):
    res = run_child("""
        import sys, torch
        from radixlang.runtime.model_loading import load_model
        load_model(sys.argv[1], torch.device("cpu"), torch.float32, quantization="auto")
    """, tiny_gguf)  # and exits while the entry may still be being written
    assert res.returncode == 0, res.stderr
    assert_entry_is(entry_of(tiny_gguf, "auto"), converted_state(tiny_gguf, "auto"))
    assert not list(weight_cache.cache_dir().glob("*.part"))


def test_a_writer_killed_mid_write_leaves_no_entry_and_the_next_write_removes_its_part(tiny_gguf):
    res = run_child("""
        import os, signal, sys, torch
        from radixlang.runtime.models.loading import weight_cache

        class Fatal(torch.Tensor):  # the second tensor: the process dies while writing it
            def detach(self):
                os.kill(os.getpid(), signal.SIGKILL)
        tensors = {"a": torch.ones(1000), "b": torch.zeros(10).as_subclass(Fatal)}
        weight_cache.save_entry("k", {"id": 1}, tensors, {})
    """, tiny_gguf)
    assert res.returncode == -signal.SIGKILL
    folder = weight_cache.cache_dir()
    (part,) = folder.glob("k.*.part")  # the half-written data, under its temporary name
    assert not (folder / "k.bin").exists() and weight_cache.load_entry("k", {"id": 1}) is None
    weight_cache.save_entry("k", {"id": 1}, {"a": torch.arange(4.0)}, {})
    assert not part.exists()
    assert_entry_is(weight_cache.load_entry("k", {"id": 1}), {"a": torch.arange(4.0)})
