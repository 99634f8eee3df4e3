"""The fast GGUF reader reads what gguf's own GGUFReader reads, in a number of Python-level reads that does
not grow with the vocabulary; the weight cache gives back the model it saved and follows its source file."""
from __future__ import annotations

import json
import os

import gguf
import numpy as np
import pytest
import torch
import transformers

from radixlang.kernels.cpu import block_kernel
from radixlang.runtime.model_loading import load_model
from radixlang.runtime.models.linear.quant import BlockLinear, Int4Linear
from radixlang.runtime.models.loading import gguf_file, loader, weight_cache
from radixlang.runtime.models.loading.gguf_file import read_gguf
from radixlang.runtime.models.loading.loader import default_model_path

from .gguf_tiny import Q, gguf_tensors, write_gguf
from .hf_tiny import BASE, save_hf_model

BUILD_MODEL = loader.build_model  # unpatched: the tests below count calls of the patched one
STRINGS = ["", "a", "Ġthe", "é€😀", "<|im_start|>", "x" * 300, "a b", "\n\t"]


def oracle_metadata(path) -> dict:
    reader = gguf.GGUFReader(str(path))
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def assert_same_as_gguf_reader(path) -> None:
    ours, reader = read_gguf(path), gguf.GGUFReader(str(path))
    want = oracle_metadata(path)
    assert ours.metadata.keys() == want.keys()
    for key, value in want.items():
        got = ours.metadata[key]
        assert (got.tolist() if isinstance(got, np.ndarray) else got) == value, key
    assert [t.name for t in ours.tensors] == [t.name for t in reader.tensors]
    for mine, theirs in zip(ours.tensors, reader.tensors):
        assert mine.tensor_type == theirs.tensor_type and mine.shape == tuple(int(d) for d in theirs.shape)
        assert mine.data.dtype == theirs.data.dtype and mine.data.shape == theirs.data.shape, mine.name
        assert np.array_equal(mine.data, theirs.data), mine.name


def write_metadata_file(path, vocab: int) -> None:
    writer = gguf.GGUFWriter(str(path), "llama")
    tokens = [STRINGS[i % len(STRINGS)] + str(i // len(STRINGS)) * (i % 3) for i in range(vocab)]
    writer.add_token_list(tokens)
    writer.add_token_types([i % 5 for i in range(vocab)])
    writer.add_token_scores([i / 7 for i in range(vocab)])
    writer.add_array("test.strings", STRINGS)
    writer.add_array("test.empty", [])
    writer.add_bool("test.flag", True)
    writer.add_uint64("test.big", 2**40 + 3)
    writer.add_int8("test.small", -5)
    writer.add_float64("test.f64", 0.1)
    writer.add_string("test.text", "naïve ☃")
    writer.add_tensor("w", np.arange(96, dtype=np.float32).reshape(3, 32))
    writer.add_tensor("q", gguf.quants.quantize(np.ones((4, 64), np.float32), Q.Q8_0), raw_dtype=Q.Q8_0)
    for step in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file):
        step()
    writer.close()


@pytest.mark.parametrize("vocab", [10, 5000])
def test_metadata_and_tensors_equal_gguf_readers(tmp_path, vocab):
    write_metadata_file(tmp_path / "m.gguf", vocab)
    assert_same_as_gguf_reader(tmp_path / "m.gguf")


def test_python_level_reads_do_not_grow_with_the_vocabulary(tmp_path, monkeypatch):
    reads = []
    for name in ("scalar", "string"):
        original = getattr(gguf_file._Cursor, name)
        monkeypatch.setattr(gguf_file._Cursor, name, lambda self, *a, _f=original: reads.append(1) or _f(self, *a))
    counts = []
    for vocab in (10, 20000):
        write_metadata_file(tmp_path / f"{vocab}.gguf", vocab)
        reads.clear()
        read_gguf(tmp_path / f"{vocab}.gguf")
        counts.append(len(reads))
    assert counts[0] == counts[1] < 100


@pytest.mark.slow  # gguf's reader parses the real model's 49k vocabulary one field at a time; the synthetic files above
# test the same reader cheaply
def test_the_default_models_metadata_equals_gguf_readers():
    want, got = oracle_metadata(default_model_path()), read_gguf(default_model_path()).metadata
    assert len(got["tokenizer.ggml.tokens"]) == 49152 and len(got["tokenizer.ggml.merges"]) == 48900
    for key, value in want.items():
        mine = got[key]
        assert (mine.tolist() if isinstance(mine, np.ndarray) else mine) == value, key


def test_a_truncated_string_array_is_refused(tmp_path):
    write_metadata_file(tmp_path / "m.gguf", 50)
    data = (tmp_path / "m.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:600])
    with pytest.raises(ValueError, match="past the end"):
        read_gguf(tmp_path / "cut.gguf")


@pytest.fixture
def q4_gguf(tmp_path):
    config = transformers.LlamaConfig(**(BASE | dict(tie_word_embeddings=True)))
    model = save_hf_model(tmp_path / "hf", config)
    hf = json.loads((tmp_path / "hf" / "config.json").read_text())

    def write(seed: int):
        weights = {k: v + seed * 0.01 for k, v in model.state_dict().items()}
        tensors, _ = gguf_tensors(hf, weights, Q.Q4_1, np.random.default_rng(seed))
        write_gguf(tmp_path / "m.gguf", hf, tensors)
        return tmp_path / "m.gguf"
    return write


def fresh_state(path, mode: str) -> dict[str, torch.Tensor]:
    """The model converted from the file without the cache, the oracle."""
    lm = BUILD_MODEL(*loader._read_gguf(path, blocks := {})[:2], torch.device("cpu"), torch.float32)
    loader.quantize_model(lm, mode, blocks)
    return lm.state_dict()


def assert_states_equal(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].dtype == want[name].dtype and torch.equal(got[name], want[name]), name


@pytest.mark.parametrize("mode", ["none", "auto"])
def test_the_weight_cache_round_trips_and_follows_its_source(q4_gguf, mode, tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXLANG_CACHE_DIR", str(tmp_path / "cache"))
    path, cpu = q4_gguf(1), torch.device("cpu")
    conversions = []
    convert = loader.build_model
    monkeypatch.setattr(loader, "build_model", lambda *a, **k: conversions.append(1) or convert(*a, **k))
    first = load_model(path, cpu, torch.float32, quantization=mode).model
    second = load_model(path, cpu, torch.float32, quantization=mode).model
    assert len(conversions) == 1  # the second load read the cache
    assert_states_equal(second.state_dict(), fresh_state(path, mode))
    assert_states_equal(first.state_dict(), second.state_dict())
    if mode == "auto":
        kind = BlockLinear if block_kernel.available() else Int4Linear  # conftest loaded the kernel where it builds
        assert type(first.lm_head) is kind and type(second.lm_head) is kind
    ids = torch.tensor([[1, 5, 9, 3]])
    assert torch.equal(first.embed_tokens(ids), second.embed_tokens(ids))

    q4_gguf(2)  # new weights: the file's size is the same, its mtime not
    os.utime(path, ns=(1, 1))
    third = load_model(path, cpu, torch.float32, quantization=mode).model
    assert len(conversions) == 2
    assert_states_equal(third.state_dict(), fresh_state(path, mode))
    assert len(list((tmp_path / "cache").glob("*.bin"))) == 1  # the stale entry was replaced


def test_a_corrupt_cache_entry_is_converted_again(q4_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXLANG_CACHE_DIR", str(tmp_path / "cache"))
    path, cpu = q4_gguf(1), torch.device("cpu")
    load_model(path, cpu, torch.float32)
    weight_cache.wait_for_write()  # the entry is written in the background
    (data,) = (tmp_path / "cache").glob("*.bin")
    data.write_bytes(data.read_bytes()[:100])  # truncated (a crash while another process wrote it)
    assert_states_equal(load_model(path, cpu, torch.float32).model.state_dict(), fresh_state(path, "none"))
    assert weight_cache.cache_dir() == tmp_path / "cache"
