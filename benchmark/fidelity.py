"""Greedy fidelity: radixlang vs HF transformers on the same GGUF (dequantized, fp32, CPU).

Needs `transformers` and `accelerate`: pip install -e ".[test,bench]"
Runs both on 20 prompts x 64 new tokens and prints how many token sequences match exactly, and the
largest first-step log-prob difference.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from radixlang.runtime.engine import Engine
from radixlang.runtime.models.loader import default_model_path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_baseline import load_causal_lm  # noqa: E402  (one loader for every transformers baseline)

PROMPTS = json.loads((Path(__file__).parents[1] / "tests" / "data" / "hf_greedy_smollm2.json").read_text())["cases"]


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
    args = parser.parse_args()
    path = default_model_path()
    inputs = [c["input_ids"] for c in PROMPTS]

    t0 = time.perf_counter()
    ref_ids, ref_first = transformers_greedy(path, inputs, args.new_tokens)
    t_ref = time.perf_counter() - t0

    with Engine(device="cpu", kv_cache_tokens=8192) as engine:
        t0 = time.perf_counter()
        outs = engine.generate(input_ids=inputs, sampling_params={"temperature": 0, "max_new_tokens": args.new_tokens},
                               return_logprob=True, top_logprobs_num=5)
        t_ours = time.perf_counter() - t0
        engine.check_invariants()

    exact = sum(o.output_ids == r for o, r in zip(outs, ref_ids))
    max_diff = 0.0
    for o, first in zip(outs, ref_first):
        for token, lp in o.meta.output_logprobs[0].top:
            max_diff = max(max_diff, abs(lp - first[token].item()))
    print(f"exact greedy match: {exact}/{len(inputs)} ({100 * exact / len(inputs):.0f}%)")
    print(f"max |first-step top-5 logprob diff|: {max_diff:.2e}")
    print(f"transformers (one prompt at a time): {t_ref:.1f}s   radixlang (batched): {t_ours:.1f}s   "
          f"speed ratio: {t_ref / t_ours:.2f}x")


if __name__ == "__main__":
    main()
