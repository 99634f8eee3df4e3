"""Issue 43 on the real default model (`quantization="auto"`: the GGUF's Q4_1 / Q8_0 blocks on the block kernel):
a request's greedy tokens and their logprobs do not depend on whether its prompt was cached, on its batch
neighbours, or on how its prefill was chunked. The oracle is the same request run first, cold and alone, in one
chunk. Eager decode (compile_layers=False): the compiled decode is not covered here."""
from __future__ import annotations

import pytest

from radixlang.runtime.engine import Engine

pytestmark = pytest.mark.e2e

GREEDY = {"temperature": 0, "max_new_tokens": 8}
NEIGHBOURS = ["Tell me a long story about the sea. " * (12 + 10 * i) for i in range(4)]


def run(engine: Engine, prompts: list[str]) -> list[tuple[list[int], list[float]]]:
    outs = engine.generate(prompts, GREEDY, return_logprob=True)
    return [(o.output_ids, [lp.logprob for lp in o.meta.output_logprobs]) for o in outs]


def test_default_mode_answers_the_same_cached_batched_and_chunked():
    with Engine(device="cpu", kv_cache_tokens=8192, compile_layers=False) as engine:
        prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
        [cold] = run(engine, [prompt])
        [cached] = run(engine, [prompt])  # all but the last prompt token from the radix cache
        batched = run(engine, [*NEIGHBOURS[:2], prompt, *NEIGHBOURS[2:]])[2]
        engine.check_invariants()
    with Engine(device="cpu", kv_cache_tokens=8192, compile_layers=False, max_prefill_tokens=7) as engine:
        [chunked] = run(engine, [prompt])
        engine.check_invariants()
    assert cached == cold and batched == cold and chunked == cold
