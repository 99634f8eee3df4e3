"""The sharded Llama in one process: two ranks as threads over an in-process gloo group, against the
unsharded model on the same weights. Covers what the engine test's model does not: biases on every
linear, a tied head, a vocabulary that does not split evenly, and a replicated KV head. In the default mode
(block-quantized linears) the oracle is one rank's logits, bit for bit."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from radixlang.kernels.backend import AttentionBatch
from radixlang.kernels.cpu import block_kernel
from radixlang.kernels.cpu.gguf_blocks import GROUP, GroupQuant
from radixlang.kernels.reference import TorchAttention
from radixlang.runtime.config import EngineConfig
from radixlang.runtime.distributed.group import TensorParallel
from radixlang.runtime.distributed.layers import check_tp_size, kv_heads_per_rank
from radixlang.runtime.kv.memory import KVPool
from radixlang.runtime.model_loading import load_model
from radixlang.runtime.models.linear.quant import BlockLinear, quantize_int4_rtn, quantize_model
from radixlang.runtime.models.linear.sharded_blocks import ShardedBlockLinear, shard_block_linears
from radixlang.runtime.models.llama import ForwardContext, LlamaForCausalLM, use_fixed_order
from radixlang.runtime.models.loading.hf_config import config_from_hf
from radixlang.runtime.models.loading.loader import build_model
from radixlang.server.cli import _engine_options, build_parser, main
from tests.conftest import TINY_CONFIG, tiny_weights
from tests.runtime.models.gguf_tiny import Q, gguf_tensors, write_gguf
from tests.runtime.models.hf_tiny import BASE

from .thread_ranks import run_ranks

CONFIG = TINY_CONFIG | {"vocab_size": 1001, "num_key_value_heads": 1, "tie_word_embeddings": True,
                        "attention_bias": True, "mlp_bias": True}


def _weights(config: dict = CONFIG) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    w = {k: v for k, v in tiny_weights(config).items() if k != "lm_head.weight"}
    for name, t in list(w.items()):
        if name.endswith("_proj.weight"):
            w[name.replace(".weight", ".bias")] = torch.randn(t.shape[0], generator=g) * 0.1
    return w


def _q8(weight: torch.Tensor) -> GroupQuant:
    """Q8_0-like blocks: symmetric 8-bit codes, an fp16 scale per 32 weights."""
    groups = weight.view(weight.shape[0], -1, GROUP)
    scale = (groups.abs().amax(-1) / 127).half().float()
    codes = torch.round(groups / scale[..., None]).clamp(-128, 127).view_as(weight).to(torch.int16)
    return GroupQuant(codes, scale, torch.zeros_like(scale), bits=8)


def _blocks(config: dict) -> dict[str, GroupQuant]:
    """The default mode's weights, as a GGUF's blocks would give them: every linear in 4-bit groups but the MLP's
    down projections in 8-bit blocks (the kernel's two forms), and the tied head's from the embedding."""
    return {name: _q8(w) if "down_proj" in name else quantize_int4_rtn(w)
            for name, w in _weights(config).items() if name.endswith("proj.weight") or "embed_tokens" in name}


def _logits(tp: TensorParallel, ids: torch.Tensor, config: dict = CONFIG,
            blocks: dict[str, GroupQuant] | None = None) -> torch.Tensor:
    """One prefill of `ids` through this rank's shard of the model: [len(ids), vocab] on rank 0. With `blocks`,
    in the default mode ("auto": the linears on the block kernel), as the loader packs them at each tp size."""
    cfg = config_from_hf(config)
    model = build_model(cfg, _weights(config).items(), torch.device("cpu"), torch.float32, tp)
    if blocks is not None and tp.size == 1:
        assert quantize_model(model, "auto", blocks) == 4 * cfg.num_layers + 1  # qkv, o, gate_up, down; the head
    elif blocks is not None:
        assert shard_block_linears(model, tp, blocks) == 4 * cfg.num_layers + 1
    return _prefill_logits(model, ids)


def cpu_ranks(tp: TensorParallel) -> TensorParallel:
    """`tp` as the engine's CPU ranks have it (wiring.py, worker.py): row-parallel linears gathered."""
    tp.gathered_rows = True
    return tp


def _prefill_logits(model: LlamaForCausalLM, ids: torch.Tensor) -> torch.Tensor:
    cfg, tp = model.config, model.tp
    pool = KVPool(64, cfg.num_layers, kv_heads_per_rank(cfg.num_kv_heads, tp.size), cfg.head_dim,
                  torch.float32, torch.device("cpu"))
    attn = TorchAttention(pool.k_buffers, pool.v_buffers)
    n = len(ids)
    table = torch.arange(n, dtype=torch.int32)[None, :]
    plan = attn.plan(AttentionBatch(table, [0], [n], [n], list(range(n)), [None]))
    with torch.inference_mode():
        return model.compute_logits(model(ids, plan.positions, ForwardContext(attn)))


def test_two_ranks_compute_the_logits_of_the_unsharded_model():
    ids = torch.tensor([5, 999, 1000, 17, 500, 3, 42], dtype=torch.int64)  # ids in both vocabulary halves
    want = _logits(TensorParallel(), ids)
    got = run_ranks(2, lambda tp: _logits(tp, ids))
    assert got[0].shape == want.shape == (len(ids), 1001)
    assert torch.allclose(got[0], want, atol=1e-4, rtol=1e-4)
    assert torch.equal(got[0].argmax(-1), want.argmax(-1))


@pytest.mark.skipif(not block_kernel.available(wait=True), reason="no dense_mm (built with the block kernel)")
def test_two_ranks_in_the_exact_mode_compute_one_ranks_logits_bit_for_bit():
    """fp32 linears on dense_mm (each output feature's sum in one order) and, as the engine's CPU ranks have them,
    gathered row-parallel linears (whole-K output features, all-gathered): every float sum runs in one rank's
    order. The K-split all-reduce added partial sums in another order: close logits, not the same bits."""
    ids = torch.tensor([5, 999, 1000, 17, 500, 3, 42], dtype=torch.int64)

    def logits(tp: TensorParallel) -> torch.Tensor:
        model = build_model(config_from_hf(CONFIG), _weights().items(), torch.device("cpu"), torch.float32,
                            cpu_ranks(tp))
        # every linear, the tied head, every norm (2 a layer and the final one)
        assert use_fixed_order(model) == 6 * CONFIG["num_hidden_layers"] + 2
        return _prefill_logits(model, ids)

    want = logits(TensorParallel())
    got = run_ranks(2, logits)
    assert got[0].shape == want.shape == (len(ids), 1001)
    assert torch.equal(got[0], want)


def test_two_ranks_in_the_default_mode_compute_one_ranks_logits_bit_for_bit():
    """Block-quantized linears (4- and 8-bit, with biases; the tied head's 504 rows a rank, padded to the kernel's
    16) and the CPU's attention_rows: the gathered row-parallel linears keep every float sum in one rank's order."""
    config = CONFIG | {"vocab_size": 1008}  # a multiple of 16: the head is packed, as SmolLM2's
    ids = torch.tensor([5, 999, 1000, 17, 500, 3, 42], dtype=torch.int64)
    blocks = _blocks(config)
    want = _logits(TensorParallel(), ids, config, blocks)
    got = run_ranks(2, lambda tp: _logits(cpu_ranks(tp), ids, config, blocks))
    assert got[0].shape == want.shape == (len(ids), 1008)
    assert torch.equal(got[0], want)
    exact = _logits(TensorParallel(), ids, config)  # the blocks' rounding shows: the packed model ran
    assert not torch.equal(exact, want)


def test_a_gguf_loaded_by_two_ranks_in_the_default_mode_gives_one_ranks_logits_bit_for_bit(tmp_path):
    """The loader's path: a Q8_0 file's blocks (q / k rows un-permuted, the tied head from the embedding), each
    rank packing its own shards."""
    hf = {"architectures": ["LlamaForCausalLM"], "tie_word_embeddings": True, "rope_theta": 10000.0} | BASE
    weights = {k: v for k, v in tiny_weights(hf).items() if k != "lm_head.weight"}
    write_gguf(tmp_path / "m.gguf", hf, gguf_tensors(hf, weights, Q.Q8_0, np.random.default_rng(0))[0])
    ids = torch.tensor([3, 287, 100, 150, 9], dtype=torch.int64)

    def logits(tp: TensorParallel) -> torch.Tensor:
        model = load_model(tmp_path / "m.gguf", torch.device("cpu"), torch.float32, cpu_ranks(tp),
                           quantization="auto").model
        assert isinstance(model.layers[0].mlp.down_proj, ShardedBlockLinear if tp.size > 1 else BlockLinear)
        return _prefill_logits(model, ids)

    want = logits(TensorParallel())
    assert torch.equal(run_ranks(2, logits)[0], want)


def test_auto_loads_the_blocks_under_tp_only_where_the_block_kernel_runs(monkeypatch):
    assert block_kernel.supported()  # this machine builds it (conftest)
    assert EngineConfig(device="cpu", tp_size=3).load_quantization() == "auto"
    monkeypatch.setenv("RADIXLANG_BLOCK_KERNEL", "0")  # no kernel: one rank falls back to int4pack, TP to fp32
    assert EngineConfig(device="cpu", tp_size=3).load_quantization() == "none"
    assert EngineConfig(device="cpu", tp_size=1).load_quantization() == "auto"


def test_a_tp_size_that_does_not_split_the_hidden_size_is_refused_naming_the_sizes():
    check_tp_size(9, 3, 1536, 576, 3)  # SmolLM2 at --tp 3
    with pytest.raises(ValueError, match=r"tp_size 4 does not fit.*4 query heads, 2 KV heads, intermediate size 128 "
                                         r"and hidden size 66.*one of \[1, 2\]"):
        check_tp_size(4, 2, 128, 66, 4)  # the heads split, the row-parallel outputs would not


def test_tp_flag_and_its_long_spelling_set_tp_size():
    for flag in ("--tp", "--tp-size"):
        args = build_parser().parse_args(["serve", flag, "3"])
        assert _engine_options(args) == {"tp_size": 3}


def test_dp_attention_takes_sglangs_flags_and_dp_counts_its_ranks(capsys):
    for flag in ("--enable-dp-attention", "--dp-attention"):
        args = build_parser().parse_args(["serve", "--tp", "2", flag])
        assert _engine_options(args) == {"tp_size": 2, "enable_dp_attention": True}
    # SGLang's `--tp 2 --dp 2 --enable-dp-attention` is one engine; a --dp other than --tp is refused before loading
    assert main(["serve", "--tp", "2", "--dp", "4", "--enable-dp-attention"]) == 2
    assert "must equal --tp (2), got 4" in capsys.readouterr().err
