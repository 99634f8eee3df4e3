"""Multi-LoRA serving's cost (docs/lora.md): a batch of --batch requests mixing --adapters LoRA adapters (rank --rank,
all seven targets) against the same batch on the base model alone, in one engine, in the same run.

Each round generates --new tokens for --batch distinct random prompts of --prompt tokens (no shared prefix, so
the base batch gets no more cache hits than the mixed one), once on the base and once spread evenly over the
adapters, in alternating order; the cache is flushed before each. Throughput is generated tokens per second,
best of --rounds, of wall time and of the process's CPU time (a loaded machine steals wall time, not CPU time);
the ratio mixed / base is the issue's goal (>= 0.7 at batch 16 on the CPU). The 1-minute load average before and
after is printed with them: on a machine other jobs share, read the CPU-time ratio.

The adapters are random, written in PEFT's folder format (adapter_config.json + adapter_model.safetensors) at the
model's own shapes, so the script needs no download and no peft. The decode forward is not compiled
(compile_layers=False) on either side: steps holding adapter rows run eagerly.

    python -m radixlang.benchmark.lora                       # CPU: the default model (GGUF, the default mode)
    python -m radixlang.benchmark.lora --device cuda --batch 64 --new 128   # GPU: the Triton delta (prepared)
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from radixlang.runtime.engine import Engine
from radixlang.runtime.lora.adapter import TARGETS
from radixlang.runtime.models.llama import LlamaConfig

_MODULES = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
            "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def write_adapter(folder: Path, cfg: LlamaConfig, rank: int, seed: int) -> Path:
    """A random LoRA adapter of every target, as PEFT saves one (its key names and config fields)."""
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    h, i = cfg.hidden_size, cfg.intermediate_size
    shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
              "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}  # (in, out)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(cfg.num_layers):
        for target in TARGETS:
            fan_in, fan_out = shapes[target]
            key = f"base_model.model.model.layers.{layer}.{_MODULES[target]}.{target}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, fan_in, generator=g) * fan_in**-0.5
            tensors[f"{key}.lora_B.weight"] = torch.randn(fan_out, rank, generator=g) * 0.01
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(TARGETS), "bias": "none"}))
    return folder


def throughput(engine: Engine, prompts: list[list[int]], loras: list[str | None], new: int) -> tuple[float, float]:
    """(tokens per wall second, tokens per CPU second) of one batch."""
    engine.flush_cache()
    started, cpu = time.perf_counter(), time.process_time()
    outs = engine.generate(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": new,
                                                               "ignore_eos": True}, lora=loras)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu
    assert isinstance(outs, list)
    tokens = sum(len(o.output_ids) for o in outs)
    return tokens / seconds, tokens / cpu_seconds


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="GGUF file or HF folder (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quantization", default="auto")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens")
    parser.add_argument("--new", type=int, default=64, help="generated tokens per request")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]  # a shared machine's other jobs: they steal wall time, not CPU time
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        engine = Engine(args.model, device=args.device, quantization=args.quantization, compile_layers=False,
                        max_loras_per_batch=args.adapters, max_lora_rank=args.rank,
                        kv_cache_tokens=args.batch * (args.prompt + args.new) * 2 + 1024)
        try:
            cfg = engine.runner.model.config
            for k in range(args.adapters):
                engine.load_lora_adapter(f"lora{k}", write_adapter(Path(tmp) / f"lora{k}", cfg, args.rank, k))
            names = [f"lora{k % args.adapters}" for k in range(args.batch)]
            best = {"base": (0.0, 0.0), "mixed": (0.0, 0.0)}
            throughput(engine, [[rng.randrange(1000, 40000) for _ in range(8)]] * 2, [None, names[0]], 4)  # warm-up
            for r in range(args.rounds):
                prompts = [[rng.randrange(1000, 40000) for _ in range(args.prompt)] for _ in range(args.batch)]
                order = [(None, "base"), (names, "mixed")][::1 if r % 2 == 0 else -1]
                for loras, label in order:
                    wall, cpu = throughput(engine, prompts, [None] * args.batch if loras is None else loras, args.new)
                    print(f"round {r}: {label} {wall:.1f} tok/s, {cpu:.1f} tok per CPU s", file=sys.stderr, flush=True)
                    best[label] = (max(best[label][0], wall), max(best[label][1], cpu))
            engine.check_invariants()
        finally:
            engine.shutdown()
    result = {"device": args.device, "model": args.model or "SmolLM2-135M-Instruct (GGUF)",
              "quantization": args.quantization, "batch": args.batch, "adapters": args.adapters, "rank": args.rank,
              "prompt_tokens": args.prompt, "new_tokens": args.new,
              "base_tok_s": round(best["base"][0], 1), "mixed_tok_s": round(best["mixed"][0], 1),
              "mixed_over_base": round(best["mixed"][0] / best["base"][0], 3),
              "base_tok_per_cpu_s": round(best["base"][1], 1), "mixed_tok_per_cpu_s": round(best["mixed"][1], 1),
              "mixed_over_base_cpu": round(best["mixed"][1] / best["base"][1], 3),
              "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
