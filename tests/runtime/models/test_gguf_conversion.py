"""Converting a GGUF's weights does the least work: "auto" makes no fp32 copy of a weight it runs from the
file's blocks, and the fp32 copies that are made come from a torch routine equal bit for bit to gguf's."""
from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
import torch
import transformers

from radixlang.kernels.cpu import block_kernel
from radixlang.runtime.model_loading import load_model
from radixlang.runtime.models.linear.quant import BlockLinear, Int4Linear, quantize_model
from radixlang.runtime.models.llama import packed_parts
from radixlang.runtime.models.loading import loader
from radixlang.runtime.models.loading.gguf_file import GGUFTensor, read_gguf

from .gguf_tiny import Q, gguf_tensors, write_gguf
from .hf_tiny import BASE, save_hf_model

CPU = torch.device("cpu")


def as_bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)  # -0.0 and 0.0 differ here, as do NaN payloads


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q8_0])
def test_torch_dequantization_equals_ggufs_bit_for_bit(qtype):
    rng = np.random.default_rng(int(qtype))
    quantized = gguf.quants.quantize(rng.standard_normal((48, 96)).astype(np.float32) * 3, qtype)
    block_bytes = gguf.GGML_QUANT_SIZES[qtype][1]
    random_blocks = rng.integers(0, 256, (48, 3, block_bytes), dtype=np.uint8)  # any codes
    scales = rng.choice([-1, 1], (48, 3, 1)) * rng.uniform(1e-7, 60.0, (48, 3, 1))  # subnormal to large fp16
    random_blocks[..., :2] = scales.astype(np.float16).view(np.uint8)
    if qtype == Q.Q4_1:  # and a finite minimum
        random_blocks[..., 2:4] = rng.uniform(-60.0, 60.0, (48, 3, 1)).astype(np.float16).view(np.uint8)
    for raw in (quantized, random_blocks.reshape(48, -1)):
        t = GGUFTensor("w", (96, 48), int(qtype), raw)  # GGUF order: columns first
        want = gguf.quants.dequantize(raw, qtype).reshape(48, 96).astype(np.float32)
        assert torch.equal(as_bits(loader.gguf_fp32(t)), as_bits(torch.from_numpy(want)))


@pytest.fixture
def q4_gguf(tmp_path):
    """A tiny Llama GGUF in Q4_1 with a tied embedding, and its fp32 weights as gguf's numpy code gives them."""
    config = transformers.LlamaConfig(**(BASE | dict(tie_word_embeddings=True)))
    model = save_hf_model(tmp_path / "hf", config)
    hf = json.loads((tmp_path / "hf" / "config.json").read_text())
    tensors, expected = gguf_tensors(hf, model.state_dict(), Q.Q4_1, np.random.default_rng(0))
    write_gguf(tmp_path / "m.gguf", hf, tensors)
    return tmp_path / "m.gguf", {k.removeprefix("model."): v for k, v in expected.items()}


class Counts:
    def __init__(self, monkeypatch):
        self.gguf_numpy, self.fp32 = 0, []
        dequantize, fp32 = gguf.quants.dequantize, loader.gguf_fp32

        def counted_dequantize(*args, **kwargs):
            self.gguf_numpy += 1
            return dequantize(*args, **kwargs)

        def counted_fp32(t):
            if t.tensor_type not in (Q.F32, Q.F16):
                self.fp32.append(t.name)
            return fp32(t)
        monkeypatch.setattr(gguf.quants, "dequantize", counted_dequantize)
        monkeypatch.setattr(loader, "gguf_fp32", counted_fp32)


def test_auto_makes_fp32_copies_only_of_what_it_leaves_in_fp32(q4_gguf, tmp_path, monkeypatch):
    path, expected = q4_gguf
    eager = loader.build_model(*loader._read_gguf(path, blocks := {})[:2], CPU, torch.float32)  # every weight in fp32
    quantize_model(eager, "auto", blocks)
    monkeypatch.setenv("RADIXLANG_CACHE_DIR", str(tmp_path / "cache"))
    counts = Counts(monkeypatch)
    model = load_model(path, CPU, torch.float32, quantization="auto").model
    assert counts.gguf_numpy == 0 and counts.fp32 == ["token_embd.weight"]  # the embedding's lookups stay fp32
    packed = BlockLinear if block_kernel.available() else Int4Linear  # the native kernel where it is built
    assert isinstance(model.lm_head, packed) and isinstance(model.layers[0].self_attn.qkv_proj, packed)
    assert not any(p.is_meta for p in model.parameters())
    assert torch.equal(model.embed_tokens.weight, expected["embed_tokens.weight"])  # gguf's numpy dequantization
    got, want = model.state_dict(), eager.state_dict()
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].dtype == want[name].dtype and torch.equal(got[name], want[name]), name


def test_none_converts_every_weight_with_torch_equal_to_ggufs(q4_gguf, tmp_path, monkeypatch):
    path, expected = q4_gguf
    monkeypatch.setenv("RADIXLANG_CACHE_DIR", str(tmp_path / "cache"))
    counts = Counts(monkeypatch)
    model = load_model(path, CPU, torch.float32, quantization="none").model
    assert counts.gguf_numpy == 0
    for name, param in model.named_parameters():
        fused = name.split(".")[-2]  # qkv_proj stacks q_proj, k_proj, v_proj; gate_up_proj gate_proj, up_proj
        parts = [expected[name.replace(fused, f"{part}_proj")] for part in packed_parts(name)]
        assert torch.equal(as_bits(param), as_bits(torch.cat(parts) if parts else expected[name])), name


def test_the_default_model_in_auto_dequantizes_nothing_while_its_weights_stream(monkeypatch):
    counts = Counts(monkeypatch)
    file = read_gguf(loader.default_model_path())
    cfg, arch = loader._gguf_config(file)
    blocks, deferred = {}, {}
    streamed = dict(loader.gguf_weights(file, cfg, arch, blocks, deferred))
    assert counts.gguf_numpy == 0 and counts.fp32 == []  # the norms are F32: copied, not dequantized
    assert len(deferred) == len(blocks) == 211 and all(streamed[name].is_meta for name in deferred)
    assert not any(t.is_meta for name, t in streamed.items() if name not in deferred)
