"""The quantized KV cache (kv_cache_dtype int8 / fp8_e4m3) through the runtime: the pool holds ~2x a 16-bit pool's
tokens in the same bytes (the memory budget's sizing counts codes and scales), the host tier and swapping copy
codes and scales bit for bit, and a request's tokens do not depend on its batch, its cached prefix or its chunking
(oracle: the request alone on a fresh engine, as tests/runtime/test_invariance.py)."""
from __future__ import annotations

import pytest
import torch

from radixlang.kernels.cpu import block_kernel
from radixlang.runtime.config import EngineConfig
from radixlang.runtime.kv.host_tier import HostTier
from radixlang.runtime.kv.memory import KVPool
from radixlang.runtime.namespace import DEFAULT_NAMESPACE
from radixlang.runtime.wiring import kv_pool_size

from .test_invariance import GREEDY, NEIGHBOURS, PROMPT

SMOLLM = (30, 3, 64)  # SmolLM2-135M's layers, KV heads, head_dim


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8_e4m3"])
def test_the_same_memory_budget_holds_about_twice_a_16_bit_pools_tokens(kv_cache_dtype):
    per_token = {name: KVPool.bytes_per_token(*SMOLLM, torch.bfloat16, kv_cache_dtype=name)
                 for name in ("auto", kv_cache_dtype)}
    assert per_token["auto"] == 2 * 30 * 3 * 64 * 2
    assert per_token[kv_cache_dtype] == 2 * 30 * 3 * (64 + 2)  # a byte a value, an fp16 scale a (token, head)
    cfg = EngineConfig(mem_fraction=0.5, device="cpu", max_running_requests=1 << 20, context_length=1 << 20)
    sizes = {}
    for name in per_token:
        cfg.kv_cache_dtype = name
        sizes[name] = kv_pool_size(cfg, *SMOLLM, torch.bfloat16, 1 << 20)
    assert sizes[kv_cache_dtype] / sizes["auto"] == pytest.approx(128 / 66, rel=1e-3)  # 1.94x
    fp32 = KVPool.bytes_per_token(*SMOLLM, torch.float32)
    assert fp32 / per_token[kv_cache_dtype] > 3.8  # the CPU's fp32 pool: ~3.9x
    pool = KVPool(16, 2, 3, 64, torch.float32, torch.device("cpu"), kv_cache_dtype=kv_cache_dtype)
    assert pool.token_bytes == KVPool.bytes_per_token(2, 3, 64, torch.float32, kv_cache_dtype=kv_cache_dtype)


def filled_pool(kv_cache_dtype: str) -> KVPool:
    pool = KVPool(32, 2, 2, 16, torch.float32, torch.device("cpu"), kv_cache_dtype=kv_cache_dtype)
    g = torch.Generator().manual_seed(0)
    for group in pool.groups():
        for buf in group:
            buf.view(torch.uint8).copy_(torch.randint(0, 256, buf.view(torch.uint8).shape, generator=g,
                                                      dtype=torch.uint8))
    return pool


def as_bytes(pool: KVPool, slots: torch.Tensor) -> list[torch.Tensor]:
    return [buf[slots].view(torch.uint8) for group in pool.groups() for buf in group]


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8_e4m3"])
def test_host_tier_and_swap_round_trip_codes_and_scales(kv_cache_dtype):
    pool = filled_pool(kv_cache_dtype)
    assert [len(g) for g in pool.groups()] == [2, 2, 2, 2]  # K, V, K scales, V scales
    src, dst = torch.tensor([3, 9, 4, 20]), torch.tensor([30, 1, 2, 11])
    want = as_bytes(pool, src)
    tier = HostTier(8, pool.groups())
    tier.park([5, 6, 7, 8], DEFAULT_NAMESPACE, src, pool.groups())
    hosted = tier.match([5, 6, 7, 8], DEFAULT_NAMESPACE)
    assert hosted.length == 4
    tier.restore(hosted.slots, dst, pool.groups())
    assert all(torch.equal(a, b) for a, b in zip(as_bytes(pool, dst), want))
    saved = pool.swap_out(dst)
    for group in pool.groups():
        for buf in group:
            buf.zero_()
    pool.swap_in(src, saved)
    assert all(torch.equal(a, b) for a, b in zip(as_bytes(pool, src), want))
    tier.check()


def test_bad_kv_cache_dtype_is_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"kv_cache_dtype must be one of \('auto', 'int8', 'fp8_e4m3'\)"):
        EngineConfig.from_options(kv_cache_dtype="fp8")
    with pytest.raises(ValueError, match="MLA"):
        KVPool(4, 1, 1, 8, torch.float32, torch.device("cpu"), shared_kv=True, kv_cache_dtype="int8")


def answer(engine, prompt: str = PROMPT) -> tuple[list[int], list[float]]:
    out = engine.generate(prompt, GREEDY, return_logprob=True)
    return out.output_ids, [lp.logprob for lp in out.meta.output_logprobs]


@pytest.mark.skipif(not block_kernel.available(wait=True), reason="no block kernel (AVX2 and g++)")
def test_int8_kv_tokens_are_the_same_alone_batched_cached_chunked_and_speculated(tiny_engine_factory):
    # the block kernel's linears (int4) and attention_rows make every row's bits independent of its step
    options = dict(quantization="int4", compile_layers=False, kv_cache_dtype="int8")
    alone = answer(tiny_engine_factory(**options))
    auto = answer(tiny_engine_factory(**options | {"kv_cache_dtype": "auto"}))
    assert alone[1] != auto[1]  # the KV really is quantized
    engine = tiny_engine_factory(**options)
    outs = engine.generate([*NEIGHBOURS[:3], PROMPT, *NEIGHBOURS[3:]], GREEDY, return_logprob=True)
    assert (outs[3].output_ids, [lp.logprob for lp in outs[3].meta.output_logprobs]) == alone
    engine.generate(PROMPT + " Paris, and the capital of Spain is", {"max_new_tokens": 1})
    cached = engine.generate(PROMPT, GREEDY, return_logprob=True)
    assert cached.meta.cached_tokens > 0
    assert (cached.output_ids, [lp.logprob for lp in cached.meta.output_logprobs]) == alone
    engine.check_invariants()
    assert answer(tiny_engine_factory(**options, max_prefill_tokens=5)) == alone
    spec = tiny_engine_factory(**options, speculative_algorithm="NGRAM")
    assert spec.generate(PROMPT, GREEDY).output_ids == alone[0]
    spec.check_invariants()
