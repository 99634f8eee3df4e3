"""MLA's latent KV: the absorbed decode equals the up-projected (textbook) form, prefill and decode through
the backends equal MLA written from its equations, the latent pool survives the radix cache and chunked
prefill (a cached prefix scores as a recompute) and holds one row per token, and the Triton backend's
latent decode kernel gives the torch backend's tokens."""
from __future__ import annotations

import pytest
import torch

from radixlang.kernels.backend import AttentionBatch
from radixlang.kernels.mla import absorb_output, absorb_query, latent_decode, latent_extend, split_up_proj
from radixlang.kernels.reference import TorchAttention
from radixlang.kernels.registry import ATTENTION_BACKENDS
from radixlang.runtime.engine import Engine
from radixlang.runtime.kv.memory import KVPool
from radixlang.runtime.model_loading import load_model
from radixlang.runtime.models.deepseek import DeepseekConfig, MLAttention
from radixlang.runtime.models.llama import ForwardContext

from .hf_tiny import one_thread
from .test_moe_parity import build, prompts

pytestmark = pytest.mark.usefixtures(one_thread.__name__)  # the fixture, imported


@pytest.fixture(scope="module")
def v3_folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("mla")
    build(path, "deepseek-v3")
    return path / "deepseek-v3"


def mla_from_equations(attn: MLAttention, q_nope: torch.Tensor, q_rope: torch.Tensor, c_kv: torch.Tensor,
                       k_rope: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """MLA as the paper writes it: per head h, k = [W_UK^h c_kv | k_rope], v = W_UV^h c_kv, softmax(q.k * scale) v,
    then o_proj. q_*: [T, H, .]; c_kv [S, R]; k_rope [S, 1, r]; mask [T, S] bool -> [T, hidden]."""
    cfg = attn.cfg
    w = attn.kv_b_proj.weight.view(cfg.num_heads, cfg.qk_nope_head_dim + cfg.v_head_dim, cfg.kv_lora_rank)
    outs = []
    for h in range(cfg.num_heads):
        w_uk, w_uv = w[h, :cfg.qk_nope_head_dim], w[h, cfg.qk_nope_head_dim:]
        k = torch.cat([c_kv @ w_uk.T, k_rope[:, 0]], dim=-1)
        q = torch.cat([q_nope[:, h], q_rope[:, h]], dim=-1)
        scores = (q @ k.T * cfg.softmax_scale).masked_fill(~mask, float("-inf"))
        outs.append(scores.softmax(-1) @ (c_kv @ w_uv.T))
    return attn.o_proj(torch.cat(outs, dim=-1))


def test_absorbed_decode_equals_up_projected_attention():
    """Query i decoding absorbed over latent rows 0..i (padded into one batch) = the up-projected chunk's row i."""
    g = torch.Generator().manual_seed(3)
    n, heads, nope, rope, rank, v = 9, 3, 16, 8, 32, 12
    q_nope, q_rope = torch.randn(n, heads, nope, generator=g), torch.randn(n, heads, rope, generator=g)
    rows = torch.randn(n, rank + rope, generator=g)
    w_kv_b = torch.randn(heads, nope + v, rank, generator=g) * rank**-0.5
    scale = 0.2
    want = latent_extend(q_nope, q_rope, rows, torch.ones(n, n, dtype=torch.bool).tril(), w_kv_b, scale)
    w_uk, w_uv = split_up_proj(w_kv_b, nope)
    visible = torch.ones(n, n, dtype=torch.bool).tril()  # decode i sees rows 0..i: the rest is padding
    got = absorb_output(latent_decode(absorb_query(q_nope, q_rope, w_uk), rows.expand(n, -1, -1), visible, rank,
                                      scale), w_uv)
    assert got.shape == (n, heads, v)
    assert (got - want).abs().max() < 1e-5 * want.abs().max()
    assert not torch.allclose(got[1:], got[:1].expand_as(got[1:]))  # attention mixes positions


def _latent_step(attn_layer, cfg: DeepseekConfig, x: torch.Tensor, rope, kv_len: int, new: int,
                 pool: KVPool) -> torch.Tensor:
    """The absorbed layer over one sequence whose first kv_len - new positions are already in `pool`."""
    backend = TorchAttention(pool.k_buffers, pool.v_buffers)
    table = torch.arange(kv_len, dtype=torch.int32)[None]
    backend.plan(AttentionBatch(table, [0], [kv_len], [new], list(range(kv_len - new, kv_len)), [None]))
    return attn_layer(x, rope, ForwardContext(backend))


@torch.no_grad()
def test_prefill_and_decode_through_the_backend_equal_mla_from_its_equations(v3_folder):
    model = load_model(v3_folder, torch.device("cpu"), torch.float32).model
    cfg, attn = model.config, model.layers[0].self_attn
    n = 20
    x = torch.randn(n, cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    rope = model.rotary.table(torch.arange(n))
    q_nope, q_rope, c_kv, k_rope = attn.project(x, rope)
    expected = mla_from_equations(attn, q_nope, q_rope, c_kv, k_rope, torch.ones(n, n, dtype=torch.bool).tril())
    pool = KVPool(n, 1, 1, cfg.head_dim, torch.float32, torch.device("cpu"), shared_kv=True)
    prefill = _latent_step(attn, cfg, x[:n - 1], rope_rows(rope, 0, n - 1), n - 1, n - 1, pool)
    decode = _latent_step(attn, cfg, x[n - 1:], rope_rows(rope, n - 1, n), n, 1, pool)  # reads the cached latents
    got = torch.cat([prefill, decode])
    assert pool.k_buffers[0].shape[1:] == (1, cfg.kv_lora_rank + cfg.qk_rope_head_dim)
    assert (got - expected).abs().max() <= 1e-5 * expected.abs().max()
    assert not torch.allclose(expected[1:], expected[:1].expand_as(expected[1:]))  # attention mixes positions


def rope_rows(rope, start: int, end: int):
    return tuple(t[start:end] for t in rope)


def test_latent_pool_holds_one_row_per_token_and_layer():
    # DeepSeek-V3's shapes: 61 layers, 128 heads, kv_lora_rank 512, rope 64, nope 128, v 128; bf16
    bf16 = torch.bfloat16
    latent = KVPool.bytes_per_token(61, 1, 512 + 64, bf16, shared_kv=True)
    assert latent == 61 * 576 * 2
    cfg = DeepseekConfig(vocab_size=1, hidden_size=1, intermediate_size=1, num_layers=61, num_heads=128,
                         q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                         v_head_dim=128, max_position=1, softmax_scale=1.0, moe=None)
    mha = cfg.mha_bytes_per_token(2)
    assert mha == 61 * 128 * (192 + 128) * 2
    print(f"bytes/token: latent {latent} vs MHA {mha} ({mha / latent:.1f}x)")
    pool = KVPool(4, 2, 1, 40, torch.float32, torch.device("cpu"), shared_kv=True)
    assert pool.v_buffers is pool.k_buffers
    for buf in pool.k_buffers:
        buf.copy_(torch.randn(buf.shape))
    kept = [buf.clone() for buf in pool.k_buffers]
    saved = pool.swap_out(torch.tensor([1, 3]))  # preemption to host memory and back, into other slots
    pool.swap_in(torch.tensor([0, 2]), saved)
    assert all(torch.equal(buf[[0, 2]], old[[1, 3]]) for buf, old in zip(pool.k_buffers, kept, strict=True))


def test_latent_cache_prefix_scores_as_a_recompute(v3_folder):
    a, b = prompts(3)[:2]
    longer = a + b[:20]
    params = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    scored = dict(return_logprob=True, logprob_start_len=len(a), top_logprobs_num=3)  # the prefix stays cached
    runs = {}
    for cached in (True, False):
        with Engine(str(v3_folder), device="cpu", kv_cache_tokens=512, max_prefill_tokens=32,
                    disable_radix_cache=not cached) as engine:
            engine.generate(input_ids=a, sampling_params=params)
            out = engine.generate(input_ids=longer, sampling_params=params, **scored)
            engine.check_invariants()
        runs[cached] = out
    assert runs[True].meta.cached_tokens >= len(a) - 1 and runs[False].meta.cached_tokens == 0
    assert runs[True].output_ids == runs[False].output_ids
    for hit, miss in zip(runs[True].meta.input_logprobs + runs[True].meta.output_logprobs,
                         runs[False].meta.input_logprobs + runs[False].meta.output_logprobs, strict=True):
        assert [t for t, _ in hit.top] == [t for t, _ in miss.top]
        assert max(abs(x - y) for (_, x), (_, y) in zip(hit.top, miss.top, strict=True)) < 1e-4


@pytest.mark.parametrize("options", [dict(disable_cuda_graph=False), dict(speculative_algorithm="NGRAM")],
                         ids=["decode-buckets", "ngram-trees"])
def test_latent_pool_decodes_match_plain_decodes(v3_folder, options):
    """The fixed-shape decode step (CUDA graphs' buckets, uncaptured on the CPU) and n-gram speculation's
    token trees (verified with a tree mask, kept paths moved by slot) over latent KV."""
    batch = [p[:24] * 3 for p in prompts(5)]  # repetitive: the n-gram drafter finds drafts
    params = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
    outs = []
    for extra in ({}, options):
        with Engine(str(v3_folder), device="cpu", kv_cache_tokens=1024, **extra) as engine:
            outs.append([o.output_ids for o in engine.generate(input_ids=batch, sampling_params=params)])
            engine.check_invariants()
            verified = engine.stats()["spec_verify_steps_total"]
    assert outs[0] == outs[1]
    assert "speculative_algorithm" not in options or verified > 0


@pytest.mark.skipif("triton" not in ATTENTION_BACKENDS, reason="triton is not installed")
def test_triton_latent_decode_kernel_gives_the_torch_backends_tokens(v3_folder, monkeypatch):
    """The Triton backend on a latent pool (interpreted on a CPU): extends up-projected, decodes in the MLA
    kernel; logprobs as the torch backend's."""
    from radixlang.kernels.triton import backend as triton_backend

    decodes = []
    kernel = triton_backend.mla_decode
    monkeypatch.setattr(triton_backend, "mla_decode", lambda q, *args: decodes.append(q.shape[0]) or kernel(q, *args))
    batch = [p[:16] for p in prompts(6)[:3]]
    params = {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}
    runs = []
    for backend in ("torch", "triton"):
        with Engine(str(v3_folder), device="cpu", kv_cache_tokens=256, attention_backend=backend) as engine:
            runs.append(engine.generate(input_ids=batch, sampling_params=params, return_logprob=True,
                                        top_logprobs_num=2))
            engine.check_invariants()
    for ours, ref in zip(runs[1], runs[0], strict=True):
        assert ours.output_ids == ref.output_ids
        for x, y in zip(ours.meta.output_logprobs, ref.meta.output_logprobs, strict=True):
            assert max(abs(p - q) for (_, p), (_, q) in zip(x.top, y.top, strict=True)) < 1e-4
    assert decodes and max(decodes) == len(batch)  # the kernel ran every decode step, the batch together
