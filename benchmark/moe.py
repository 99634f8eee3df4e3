"""MoE load balance: tokens per expert-parallel rank before and after EPLB, and the EP step's expert compute,
balanced against unbalanced, on a tiny MoE layer whose router favours a few hot experts.

The layer is the engine's own (models.moe_llama.SparseMoeBlock: router, grouped experts, physical expert
table). A skewed router: the router's rows for the hot experts lean towards the tokens' common direction.
1. Route a calibration batch, count tokens per expert (the block's `load` counters), place the experts
   with `eplb.place_experts` (redundant replicas of hot ones) and apply the placement.
2. On a fresh batch, count the (token, choice) rows each rank receives under the identity placement and
   under EPLB's: max / mean over ranks (goal <= 1.15 from >= 2).
3. EP step time: each rank's grouped expert matmuls over the rows it receives, timed one rank after
   another in this process; the step waits for the slowest rank, so the step's expert time is the
   maximum. No communication is timed (the all_to_all moves the same rows either way). The cores are
   shared with other work, so compare the two figures of one run, not across runs.

    .venv/bin/python benchmark/moe.py [--experts 16] [--ranks 4] [--redundant 8] [--tokens 4096]

`--dp-attention` measures instead the decode step of a small DeepSeek-V3-shaped MoE (random weights, built
with transformers) served over 2 ranks with the experts expert-parallel: DP attention (each rank attends to
its own requests over its own latent pool) against TP attention (each rank attends to every request with
half the heads), at a small batch. Decode step = the extra wall time of a longer generation per extra token.

    flock /work/coord/bench.lock .venv/bin/python benchmark/moe.py --dp-attention [--batch 4] [--prompt 256]
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from radixlang.runtime.models.eplb import place_experts
from radixlang.runtime.models.moe import ExpertTable, MoeSpec, grouped_mlp
from radixlang.runtime.models.moe_llama import SparseMoeBlock


def skewed_block(experts: int, hidden: int, inter: int, hot: int, seed: int) -> tuple[SparseMoeBlock, torch.Tensor]:
    """A MoE block whose first `hot` experts the router favours, and the tokens' common direction."""
    g = torch.Generator().manual_seed(seed)
    block = SparseMoeBlock(MoeSpec(num_experts=experts, top_k=2, intermediate_size=inter), hidden)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)
        direction = torch.randn(hidden, generator=g)
        block.gate.weight[:hot] += 0.5 * direction / direction.norm()
    block.reset()
    return block, direction / direction.norm()


def tokens(n: int, hidden: int, direction: torch.Tensor, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, hidden, generator=g) + 3.0 * direction


def rows_per_rank(block: SparseMoeBlock, x: torch.Tensor, ranks: int) -> tuple[list[int], torch.Tensor]:
    """(rows each rank receives, the physical choices [T, k]) under the block's current placement."""
    _, ids = block.gate(x)
    phys = block.table.to_physical(ids)
    per_rank = block.table.num_physical // ranks
    counts = torch.bincount(phys.flatten() // per_rank, minlength=ranks).tolist()
    return counts, phys


def rank_expert_seconds(block: SparseMoeBlock, x: torch.Tensor, phys: torch.Tensor, ranks: int,
                        repeats: int) -> list[float]:
    """Median seconds of each rank's grouped expert matmuls over the rows routed to it."""
    table, experts = block.table, block.experts
    per_rank = table.num_physical // ranks
    flat = phys.flatten()
    order = flat.argsort(stable=True)
    rows_all = x.index_select(0, order // phys.shape[1])
    counts = torch.bincount(flat, minlength=table.num_physical).tolist()
    logical = table.phys_to_logical.tolist()
    seconds, start = [], 0
    for r in range(ranks):
        mine = counts[r * per_rank:(r + 1) * per_rank]
        rows = rows_all[start:start + sum(mine)]
        start += sum(mine)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            grouped_mlp(rows, mine, logical[r * per_rank:(r + 1) * per_rank], experts.gate_up_proj,
                        experts.down_proj)
            times.append(time.perf_counter() - t0)
        seconds.append(statistics.median(times))
    return seconds


def imbalance(values: list[float]) -> float:
    return max(values) / (sum(values) / len(values))


def write_tiny_deepseek(path: Path) -> Path:
    """A DeepSeek-V3-shaped MoE (MLA, one dense layer, 8 routed experts + a shared one) with SmolLM2's tokenizer."""
    import transformers

    from radixlang.testing.random_llama import smollm2_tokenizer, write_tokenizer_files

    tokenizer = smollm2_tokenizer()
    cfg = transformers.DeepseekV3Config(
        vocab_size=tokenizer.vocab_size, hidden_size=512, intermediate_size=1024, moe_intermediate_size=256,
        num_hidden_layers=4, first_k_dense_replace=1, num_attention_heads=8, num_key_value_heads=8,
        q_lora_rank=128, kv_lora_rank=128, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
        n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1,
        max_position_embeddings=2048)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(str(path))
    return write_tokenizer_files(path, tokenizer)


def decode_step_ms(folder: Path, batch: int, prompt: int, repeats: int, **options: bool) -> float:
    """Median ms of one decode step of `batch` requests over 2 ranks (EP experts), from the difference of a
    long and a short generation."""
    from radixlang.runtime.engine import Engine

    g = torch.Generator().manual_seed(0)
    short, long = 8, 40
    times: dict[int, list[float]] = {short: [], long: []}
    with Engine(str(folder), device="cpu", tp_size=2, kv_cache_tokens=8192, disable_radix_cache=True,
                **options) as engine:
        for _ in range(repeats):
            for n in (short, long):
                prompts = torch.randint(0, 40000, (batch, prompt), generator=g).tolist()
                t0 = time.perf_counter()
                engine.generate(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": n,
                                                                    "ignore_eos": True})
                times[n].append(time.perf_counter() - t0)
    return 1e3 * (statistics.median(times[long]) - statistics.median(times[short])) / (long - short)


def dp_attention_main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_tiny_deepseek(Path(tmp) / "deepseek")
        decode_step_ms(folder, args.batch, args.prompt, 1)  # warm-up: page in the weights, start the workers
        tp = decode_step_ms(folder, args.batch, args.prompt, args.repeats)
        dp = decode_step_ms(folder, args.batch, args.prompt, args.repeats, enable_dp_attention=True)
    print(json.dumps({"batch": args.batch, "prompt_tokens": args.prompt, "ranks": 2,
                      "decode_step_ms_tp_attention": round(tp, 2), "decode_step_ms_dp_attention": round(dp, 2),
                      "dp_over_tp_speed": round(tp / dp, 2),
                      "note": "same run; both with the experts expert-parallel over the 2 ranks"}, indent=1))


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--redundant", type=int, default=8, help="extra physical experts (replicas)")
    parser.add_argument("--hot", type=int, default=2, help="experts the router favours")
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--inter", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dp-attention", action="store_true", help="DP against TP attention's decode step")
    parser.add_argument("--batch", type=int, default=4, help="--dp-attention: requests decoding together")
    parser.add_argument("--prompt", type=int, default=256, help="--dp-attention: prompt tokens of each")
    args = parser.parse_args()
    if args.dp_attention:
        dp_attention_main(args)
        return
    torch.set_num_threads(1)
    block, direction = skewed_block(args.experts, args.hidden, args.inter, args.hot, seed=0)
    block(tokens(args.tokens, args.hidden, direction, seed=1))  # calibration: fills the load counters
    load = block.load.tolist()
    x = tokens(args.tokens, args.hidden, direction, seed=2)  # a fresh batch for both placements
    before, phys = rows_per_rank(block, x, args.ranks)
    time_before = rank_expert_seconds(block, x, phys, args.ranks, args.repeats)
    placement = place_experts(load, args.experts + args.redundant, args.ranks)
    block.set_table(ExpertTable.from_phys_to_logical(list(placement.phys_to_logical), args.experts))
    after, phys = rows_per_rank(block, x, args.ranks)
    time_after = rank_expert_seconds(block, x, phys, args.ranks, args.repeats)
    print(json.dumps({
        "experts": args.experts, "ranks": args.ranks, "physical_after": args.experts + args.redundant,
        "hot_share": round(sum(sorted(load)[-args.hot:]) / sum(load), 3),
        "rows_per_rank_before": before, "rows_per_rank_after": after,
        "max_over_mean_before": round(imbalance(before), 3), "max_over_mean_after": round(imbalance(after), 3),
        "ep_expert_ms_unbalanced": round(1e3 * max(time_before), 3),
        "ep_expert_ms_balanced": round(1e3 * max(time_after), 3),
        "step_speedup": round(max(time_before) / max(time_after), 2),
        "note": "ranks timed one after another on shared cores; step time = slowest rank's expert matmuls",
    }, indent=1))


if __name__ == "__main__":
    main()
