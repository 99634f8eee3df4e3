"""Loading an HF folder: weights whose dtype already matches are the mapped file itself (no copy), the fused
ones come mapped from the weight cache once stacked, and the default dtype follows the folder on CUDA."""
from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from radixlang.runtime.config import EngineConfig
from radixlang.runtime.models.loading import weight_cache
from radixlang.runtime.models.loading.loader import load_language_model

from .hf_tiny import BASE, save_hf_model

transformers = pytest.importorskip("transformers")
FUSED = ("qkv_proj", "gate_up_proj")  # stacked from several checkpoint tensors: one new tensor each


def _mapped_ranges(path) -> list[tuple[int, int]]:
    """The address ranges this process maps `path` at (from /proc/self/maps)."""
    ranges = []
    for line in open("/proc/self/maps"):
        if line.rstrip().endswith(str(path)):
            start, end = line.split()[0].split("-")
            ranges.append((int(start, 16), int(end, 16)))
    return ranges


def _in(ranges: list[tuple[int, int]], t: torch.Tensor) -> bool:
    return any(start <= t.data_ptr() and t.data_ptr() + t.nbytes <= end for start, end in ranges)


@pytest.mark.skipif(not open("/proc/self/maps").readable(), reason="needs /proc/self/maps")
def test_a_folder_in_its_own_dtype_loads_as_views_of_the_mapped_file(tmp_path):
    reference = save_hf_model(tmp_path, transformers.LlamaConfig(**BASE))
    loaded = load_language_model(tmp_path, torch.device("cpu"), torch.float32)
    ranges = _mapped_ranges((tmp_path / "model.safetensors").resolve())
    params = dict(loaded.model.named_parameters())
    views = {name for name, p in params.items() if _in(ranges, p)}
    assert views == {name for name in params if not any(f in name for f in FUSED)}
    assert len(views) == 3 + 4 * BASE["num_hidden_layers"]  # embedding, norm, head; 2 norms, o, down per layer
    expected = dict(reference.named_parameters())
    for name in views:
        assert torch.equal(params[name], expected["model." + name if "lm_head" not in name else name])


def test_a_bf16_folder_widens_to_fp32_on_cpu_exactly(tmp_path):
    save_hf_model(tmp_path, transformers.LlamaConfig(**BASE)).to(torch.bfloat16).save_pretrained(str(tmp_path))
    loaded = load_language_model(tmp_path, torch.device("cpu"), EngineConfig(model=str(tmp_path)).torch_dtype())
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as st:
        stored = st.get_tensor("model.layers.0.mlp.down_proj.weight")
    ours = loaded.model.layers[0].mlp.down_proj.weight
    assert stored.dtype == torch.bfloat16 and ours.dtype == torch.float32
    assert torch.equal(ours, stored.float())


@pytest.mark.parametrize("stored", ["bfloat16", "float16", "float32"])
def test_auto_dtype_is_the_folders_stored_dtype_on_cuda_and_fp32_on_cpu(tmp_path, stored):
    (tmp_path / "config.json").write_text(f'{{"dtype": "{stored}"}}')
    assert EngineConfig(model=str(tmp_path), device="cuda").torch_dtype() == getattr(torch, stored)
    assert EngineConfig(model=str(tmp_path), device="cpu").torch_dtype() == torch.float32
    assert EngineConfig(model=None, device="cuda").torch_dtype() == torch.bfloat16  # a GGUF: bf16


def _stacked_by_transformers(model) -> dict[str, torch.Tensor]:
    """The fused weights of our model, stacked from transformers' own modules (the oracle)."""
    out = {}
    for i, layer in enumerate(model.model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        out[f"layers.{i}.self_attn.qkv_proj.weight"] = torch.cat([attn.q_proj.weight, attn.k_proj.weight,
                                                                  attn.v_proj.weight])
        out[f"layers.{i}.mlp.gate_up_proj.weight"] = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
    return out


@pytest.mark.skipif(not open("/proc/self/maps").readable(), reason="needs /proc/self/maps")
def test_fused_weights_load_from_the_cache_and_are_rebuilt_when_a_file_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXLANG_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "model"
    reference = save_hf_model(folder, transformers.LlamaConfig(**BASE))
    load_language_model(folder, torch.device("cpu"), torch.float32)  # stacks them and writes the entry
    weight_cache.wait_for_write()  # written in the background
    (entry,) = (tmp_path / "cache").glob("*.bin")
    second = load_language_model(folder, torch.device("cpu"), torch.float32)
    fused = {name: p for name, p in second.model.named_parameters() if any(f in name for f in FUSED)}
    assert fused.keys() == _stacked_by_transformers(reference).keys()
    ranges = _mapped_ranges(entry.resolve())
    for name, expected in _stacked_by_transformers(reference).items():
        assert _in(ranges, fused[name]), name  # mapped from the cache, not stacked again
        assert torch.equal(fused[name], expected)

    changed = save_hf_model(folder, transformers.LlamaConfig(**BASE), seed=1)  # same shapes, new weights
    third = load_language_model(folder, torch.device("cpu"), torch.float32)
    params = dict(third.model.named_parameters())
    for name, expected in _stacked_by_transformers(changed).items():
        assert torch.equal(params[name], expected)
    fourth = load_language_model(folder, torch.device("cpu"), torch.float32)  # the entry now holds the new file's
    assert torch.equal(fourth.model.layers[0].mlp.gate_up_proj.weight,
                       _stacked_by_transformers(changed)["layers.0.mlp.gate_up_proj.weight"])
