"""Greedy fidelity: radixlang vs HF transformers on the same GGUF (dequantized, fp32, CPU), and the
measures every precision mode is judged by (used by cpu_decode.py too).

Needs `transformers` and `accelerate`: pip install -e ".[test,bench]"
Runs both on 20 prompts x 64 new tokens and prints how many token sequences match exactly, and the
largest first-step log-prob difference; with --quantization, radixlang runs in that mode, and the
perplexity of a fixed text is printed for it and for fp32.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from radixlang.benchmark.hf_baseline import load_causal_lm  # one loader for every transformers baseline
from radixlang.runtime.engine import Engine
from radixlang.runtime.models.loader import default_model_path

PROMPTS = json.loads((Path(__file__).parents[1] / "tests" / "data" / "hf_greedy_smollm2.json").read_text())["cases"]
# A fixed text for perplexity (written for this benchmark): plain encyclopedic prose, ~250 tokens
FIXED_TEXT = (
    "Water moves through the environment in a continuous cycle. The sun heats oceans, lakes and rivers, and "
    "some of the water evaporates into the air as vapour. Plants also release water through their leaves. As "
    "the warm, moist air rises, it cools, and the vapour condenses into tiny droplets that form clouds. When "
    "the droplets grow heavy enough, they fall back to the ground as rain, snow, sleet or hail. Some of this "
    "water runs off the land into streams and rivers, which carry it back to the sea. Some soaks into the "
    "soil and becomes groundwater, which can stay underground for thousands of years before it reaches a "
    "spring or a well. In cold regions, water can be stored as ice in glaciers and ice sheets, which hold "
    "most of the fresh water on Earth. The cycle shapes the weather, carves valleys, and carries nutrients "
    "to plants and animals. Because people depend on fresh water for drinking, farming and industry, "
    "scientists study how changes in temperature and land use affect each step of the cycle."
)


@dataclass(slots=True)
class ReferenceRun:
    """Greedy runs on the 20 reference prompts, each as long as transformers' recorded output."""

    ids: list[list[int]]
    logprobs: list[list[float]]  # of the chosen tokens

    def equal_to_transformers(self) -> int:
        return sum(ids == case["output_ids"] for ids, case in zip(self.ids, PROMPTS))


def reference_run(engine: Engine) -> ReferenceRun:
    longest = max(len(c["output_ids"]) for c in PROMPTS)
    outs = engine.generate(input_ids=[c["input_ids"] for c in PROMPTS], return_logprob=True,
                           sampling_params={"temperature": 0, "max_new_tokens": longest})
    cut = [len(c["output_ids"]) for c in PROMPTS]
    return ReferenceRun([o.output_ids[:n] for o, n in zip(outs, cut)],
                        [[lp.logprob for lp in o.meta.output_logprobs[:n]] for o, n in zip(outs, cut)])


def shared_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def agreement(run: ReferenceRun, oracle: ReferenceRun) -> str:
    """How closely `run` follows `oracle` (the fp32 engine): equal sequences, shared leading tokens,
    and the mean |logprob delta| of the chosen tokens over the shared part."""
    shared = [shared_prefix(a, b) for a, b in zip(run.ids, oracle.ids)]
    deltas = [abs(x - y) for n, a, b in zip(shared, run.logprobs, oracle.logprobs) for x, y in zip(a[:n], b[:n])]
    same = sum(a == b for a, b in zip(run.ids, oracle.ids))
    total = sum(len(ids) for ids in oracle.ids)
    return (f"greedy-equal to fp32 on {same}/{len(PROMPTS)} prompts, {sum(shared)}/{total} leading tokens shared, "
            f"mean |logprob delta| {sum(deltas) / max(len(deltas), 1):.4f}")


def perplexity(engine: Engine, text: str = FIXED_TEXT) -> float:
    """exp(mean negative log-likelihood) of the text's tokens after the first."""
    out = engine.generate(text, {"temperature": 0, "max_new_tokens": 1}, return_logprob=True, logprob_start_len=0)
    scores = [lp.logprob for lp in out.meta.input_logprobs if lp.logprob is not None]
    return math.exp(-sum(scores) / len(scores))


def transformers_greedy(model_path: Path, inputs: list[list[int]], new_tokens: int):
    model = load_causal_lm(model_path)
    outs, firsts = [], []
    with torch.no_grad():
        for ids in inputs:
            gen = model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False,
                                 output_scores=True, return_dict_in_generate=True, eos_token_id=2)
            outs.append(gen.sequences[0, len(ids):].tolist())
            firsts.append(torch.log_softmax(gen.scores[0][0].float(), -1))
    return outs, firsts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--quantization", default="none", help="radixlang's mode: none | auto | int8 | int4")
    args = parser.parse_args()
    path = default_model_path()
    inputs = [c["input_ids"] for c in PROMPTS]

    t0 = time.perf_counter()
    ref_ids, ref_first = transformers_greedy(path, inputs, args.new_tokens)
    t_ref = time.perf_counter() - t0

    with Engine(device="cpu", kv_cache_tokens=8192, quantization=args.quantization) as engine:
        t0 = time.perf_counter()
        outs = engine.generate(input_ids=inputs, sampling_params={"temperature": 0, "max_new_tokens": args.new_tokens},
                               return_logprob=True, top_logprobs_num=5)
        t_ours = time.perf_counter() - t0
        ppl = perplexity(engine)
        engine.check_invariants()

    exact = sum(o.output_ids == r for o, r in zip(outs, ref_ids))
    max_diff = 0.0
    for o, first in zip(outs, ref_first):
        for token, lp in o.meta.output_logprobs[0].top:
            max_diff = max(max_diff, abs(lp - first[token].item()))
    print(f"quantization={args.quantization}: exact greedy match: {exact}/{len(inputs)} ({100 * exact / len(inputs):.0f}%)")
    print(f"max |first-step top-5 logprob diff|: {max_diff:.2e}   perplexity of the fixed text: {ppl:.3f}")
    print(f"transformers (one prompt at a time): {t_ref:.1f}s   radixlang (batched): {t_ours:.1f}s   "
          f"speed ratio: {t_ref / t_ours:.2f}x")


if __name__ == "__main__":
    main()
