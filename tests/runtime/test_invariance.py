"""A request's numbers do not depend on how the engine ran it (issue 43): whether its prefix was cached, which
other requests shared its steps, how its prefill was chunked. The oracle is the same request run alone on a fresh
engine, in one prefill chunk: its greedy tokens and each token's logprob must come back bitwise equal (a logprob
is the logits' difference from their logsumexp, so any change in a row's logits shows in it).

"int4" runs every linear on the block kernel (BlockLinear), the path of the default mode's GGUF weights; "none" is
the exact fp32 path, its linears on radixlang_cpu::dense_mm (one reduction order per output). Before the fixes "int4"
switched to a dense copy from ~20 rows on, so a cold prefill and an extend over a cached prefix computed the prompt's
last row on different paths, and "none" ran torch's matmul, whose kernel and blocking change with the row count."""
from __future__ import annotations

import pytest

from radixlang.kernels.cpu import block_kernel

# longer than the ~20-26 rows from which the block kernel's linears used to switch to their dense copy
PROMPT = "Paris is a city on the Seine, with old bridges, wide avenues and many museums. " * 3 + "The capital of France is"
NEIGHBOURS = [f"Neighbour {i}: " + "a long story about the sea and the ships, " * (8 + 3 * i) for i in range(6)]
GREEDY = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}

# both modes' invariant ops (block_mm, dense_mm, attention_rows) are built into the block kernel's library
NEEDS_KERNEL = pytest.mark.skipif(not block_kernel.available(wait=True), reason="no block kernel (AVX2 and g++)")
MODES = [pytest.param("none", marks=NEEDS_KERNEL), pytest.param("int4", marks=NEEDS_KERNEL)]


def answer(engine, prompt: str = PROMPT) -> tuple[list[int], list[float]]:
    out = engine.generate(prompt, GREEDY, return_logprob=True)
    return out.output_ids, [lp.logprob for lp in out.meta.output_logprobs]


@pytest.fixture
def alone(tiny_engine_factory):
    """The oracle for a mode: the prompt alone, cold, in one chunk."""
    def run(mode: str) -> tuple[list[int], list[float]]:
        return answer(tiny_engine_factory(quantization=mode, compile_layers=False))
    return run


@pytest.mark.parametrize("mode", MODES)
def test_a_cached_prefix_changes_nothing(tiny_engine_factory, alone, mode):
    engine = tiny_engine_factory(quantization=mode, compile_layers=False)
    cold = answer(engine)
    engine.generate(PROMPT + " Paris, and the capital of Spain is", {"max_new_tokens": 1})  # a longer prefix cached
    cached = engine.generate(PROMPT, GREEDY, return_logprob=True)
    assert cached.meta.cached_tokens > 0
    assert (cached.output_ids, [lp.logprob for lp in cached.meta.output_logprobs]) == cold == alone(mode)
    engine.check_invariants()


@pytest.mark.parametrize("mode", MODES)
def test_batch_neighbours_change_nothing(tiny_engine_factory, alone, mode):
    engine = tiny_engine_factory(quantization=mode, compile_layers=False)
    outs = engine.generate([*NEIGHBOURS[:3], PROMPT, *NEIGHBOURS[3:]], GREEDY, return_logprob=True)
    mine = outs[3]
    assert (mine.output_ids, [lp.logprob for lp in mine.meta.output_logprobs]) == alone(mode)
    engine.check_invariants()


@pytest.mark.parametrize("mode", MODES)
def test_prefill_chunking_changes_nothing(tiny_engine_factory, alone, mode):
    engine = tiny_engine_factory(quantization=mode, compile_layers=False, max_prefill_tokens=5)
    assert answer(engine) == alone(mode)
    engine.check_invariants()


@pytest.mark.parametrize("mode", MODES)
def test_tenant_step_bounds_change_nothing(tiny_engine_factory, alone, mode):
    """Two tenants at once (runtime/scheduling/scheduler.py's step bounds): the light tenant's first request goes
    whole ahead of the flood's prefill, which runs tenant_prefill_chunk tokens a step; the flood's prompt (second
    of its requests, so chunked) must still answer as alone."""
    from radixlang.runtime.namespace import DEFAULT_NAMESPACE
    from radixlang.runtime.submission import SubmissionBatch

    engine = tiny_engine_factory(quantization=mode, compile_layers=False, tenant_prefill_chunk=3)
    flood = engine.prepare([NEIGHBOURS[0], PROMPT], GREEDY, return_logprob=True,
                           namespace=DEFAULT_NAMESPACE.child("tenant", "flood"))
    light = engine.prepare(NEIGHBOURS[1:3], GREEDY, return_logprob=True,
                           namespace=DEFAULT_NAMESPACE.child("tenant", "light"))
    outs = engine.run(SubmissionBatch(flood.requests + light.requests, flood.prompt_rids + light.prompt_rids, False))
    mine = outs[1]
    assert (mine.output_ids, [lp.logprob for lp in mine.meta.output_logprobs]) == alone(mode)
    prompt_tokens = len(flood.requests[1].prompt_ids)
    assert engine.stats()["steps_total"] >= prompt_tokens // 3  # its prompt was chunked 3 tokens a step
    engine.check_invariants()
