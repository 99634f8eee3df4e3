"""Greedy fidelity: radixlang vs HF transformers on the same GGUF (dequantized, fp32, CPU), and the
measures every precision mode is judged by (used by cpu_decode.py too).

Needs `transformers` and `accelerate`: pip install -e ".[test,bench]"
Runs both on 20 prompts x 64 new tokens and prints how many token sequences match exactly, and the
largest first-step log-prob difference; with --quantization, radixlang runs in that mode, and the
perplexity of a fixed text is printed for it and for fp32. With --invariance, the mode's invariances (issue 43):
for 6 prompts (one of ~600 tokens), how many give bitwise the same greedy tokens and logprobs as the prompt run
cold and alone when its prompt is cached, when it shares its steps with 7 long neighbours, and when its prefill is
chunked (max_prefill_tokens=7).
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
from radixlang.runtime.models.loading.loader import default_model_path

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
# A longer fixed text (also written for this benchmark, on other subjects than the calibration text's):
# 206 tokens give a noisy perplexity when quantized models are a few percent apart; this one is ~1.2k
LONG_TEXT = FIXED_TEXT + "\n\n" + (
    "A volcano forms where molten rock from deep inside the Earth finds a way to the surface. Most volcanoes "
    "sit along the edges of tectonic plates: where one plate slides beneath another, the sinking rock "
    "releases water that lowers the melting point of the mantle above it, and the resulting magma rises "
    "through cracks in the crust. Other volcanoes, such as those of Hawaii, grow over hot spots far from any "
    "plate boundary. The shape of a volcano depends on its lava. Thin, runny basalt spreads into broad "
    "shield volcanoes with gentle slopes, while thick, sticky lava rich in silica traps gas and builds steep "
    "cones that can explode violently. Ash from a large eruption can circle the globe and cool the climate "
    "for a year or more.\n\n"
    "Honeybees live in colonies of tens of thousands of workers, a few hundred drones and a single queen. "
    "The workers are all female, and their jobs change as they age: young bees clean cells and feed larvae, "
    "middle-aged bees build comb and guard the entrance, and the oldest bees fly out to gather nectar and "
    "pollen. A forager that finds a rich patch of flowers returns to the hive and performs a waggle dance, "
    "in which the angle of her run tells the others the direction of the food relative to the sun and the "
    "length of the run tells them its distance. Nectar is stored in wax cells and fanned by the bees until "
    "most of its water has evaporated, which turns it into honey that keeps for years.\n\n"
    "The first bicycles, built in the early nineteenth century, had no pedals at all: riders pushed "
    "themselves along with their feet. Pedals attached directly to the front wheel came in the 1860s, and "
    "because one turn of the pedals meant one turn of the wheel, makers enlarged the front wheel to go "
    "faster, producing the tall and dangerous penny-farthing. The safety bicycle of the 1880s solved the "
    "problem with a chain that drove the rear wheel through gears, so that both wheels could be the same "
    "modest size. Together with the air-filled rubber tyre, invented soon afterwards, it made cycling "
    "comfortable enough for millions of people, and it gave many women a new kind of independence.\n\n"
    "A refrigerator does not create cold; it moves heat from the inside of the cabinet to the room outside. "
    "It does this with a fluid called a refrigerant that boils at a low temperature. A compressor squeezes "
    "the refrigerant gas, which makes it hot, and pumps it through coils at the back of the machine, where "
    "it gives off heat and condenses into a liquid. The liquid then passes through a narrow valve into coils "
    "inside the cabinet, where the pressure drops, the refrigerant boils, and in boiling it absorbs heat "
    "from the food and air around it. The gas returns to the compressor and the cycle starts again. Air "
    "conditioners and heat pumps work on the same principle.\n\n"
    "Coral reefs cover less than one percent of the ocean floor, yet they shelter about a quarter of all "
    "marine species. A reef is built by tiny animals called polyps, each of which lays down a skeleton of "
    "calcium carbonate beneath its soft body. Inside the tissue of most reef-building corals live "
    "single-celled algae that use sunlight to make sugars, and they share much of this food with their "
    "hosts. This partnership is why reefs grow only in clear, shallow, warm water. When the sea becomes too "
    "hot, the corals expel their algae and turn white, a process known as bleaching; if the heat lasts for "
    "weeks, many of the corals die.\n\n"
    "The Silk Road was not a single road but a web of caravan routes that linked China with Central Asia, "
    "Persia, India and the Mediterranean for more than fifteen hundred years. Silk was only one of the goods "
    "carried along it. Merchants also traded spices, glass, horses, paper, porcelain and precious metals, "
    "and few of them travelled the whole distance; instead, goods passed from one trader to the next at "
    "oasis towns and market cities. Ideas moved along the same paths. Buddhism spread from India into China, "
    "and techniques such as papermaking travelled west, while diseases moved with the travellers as well.\n\n"
    "The human heart is a muscular pump about the size of a closed fist. It has four chambers: two upper "
    "atria that receive blood and two lower ventricles that push it out. The right side of the heart sends "
    "blood to the lungs, where it picks up oxygen and releases carbon dioxide, and the left side pumps the "
    "oxygen-rich blood to the rest of the body. Valves between the chambers keep the blood flowing in one "
    "direction, and their closing makes the familiar sound of a heartbeat. An electrical signal that starts "
    "in a small cluster of cells called the sinoatrial node spreads across the heart with each beat and "
    "tells the muscle when to contract. At rest, an adult heart beats roughly sixty to eighty times a "
    "minute."
)

# A third held-out text, of other registers than LONG_TEXT's encyclopedic prose (also written for this
# benchmark, and unlike any calibration source: a story with dialogue, a letter, a notice with figures),
# ~900 tokens: quantization is judged on text the calibration never resembled
STORY_TEXT = (
    "The ferry left the harbour at a quarter past six, half an hour late, because the mate had found a crack "
    "in one of the mooring ropes and refused to sail until it was replaced. Nell stood at the rail with her "
    "grandfather's suitcase between her feet and watched the town shrink: the red roof of the fish market, "
    "the church with its crooked spire, the white house on the hill where she had spent every summer of her "
    "childhood and which now belonged to strangers.\n\n"
    "\"You'll catch your death out here,\" said a voice behind her. It was the woman from the ticket office, "
    "wrapped in a coat two sizes too large, holding out a paper cup. \"Tea. Milk, no sugar. I guessed.\"\n\n"
    "\"You guessed right,\" Nell said, and took it. \"Do you always look after the passengers?\"\n\n"
    "\"Only the ones who look as if they've left something behind.\" The woman leaned on the rail beside her. "
    "\"Most people going to the mainland are in a hurry. You're not in a hurry.\"\n\n"
    "\"My grandfather died in March. I came to clear out his workshop.\" She nudged the suitcase with her "
    "boot. \"Forty years of clocks, and this is all I could carry. The rest went to a dealer who offered me "
    "less than the brass was worth, and I let him have it because I couldn't bear to argue.\"\n\n"
    "The woman was quiet for a while. Gulls wheeled over the wake, and somewhere below them the engine "
    "changed its note as the ferry turned into the open channel. \"Old Tobias,\" she said at last. \"He "
    "mended my mother's mantel clock when I was a girl. Wouldn't take a penny for it. Said a clock that had "
    "kept a family's time for a hundred years had earned its repair.\"\n\n"
    "Nell laughed for the first time in days, and the laugh surprised her so much that she spilled her tea.\n\n"
    "Dear Mr Okafor,\n\n"
    "Thank you for your letter of the 14th and for the photographs of the damaged shelving. I am sorry that "
    "the order arrived in this condition. Our driver's report notes that two of the boxes were crushed when "
    "a pallet shifted during the journey, and I have asked the warehouse to check how the load was secured. "
    "We will send replacement parts for the three broken shelves by next Tuesday at no charge, and you need "
    "not return the damaged ones. If anything else is missing when you unpack the rest of the delivery, "
    "please call me directly on the number below rather than the general line, and I will deal with it "
    "myself.\n\n"
    "With apologies for the trouble,\n"
    "Margaret Ellis, Customer Services\n\n"
    "NOTICE TO RESIDENTS: From Monday 3 June the number 12 bus will no longer stop on Station Road while the "
    "bridge is being repaired. The nearest stops will be outside the library and at the corner of Mill Lane, "
    "about 400 metres away. Buses will run every 20 minutes on weekdays and every 30 minutes on Saturdays; "
    "there is no Sunday service. The works are expected to last eleven weeks. Residents who need help "
    "reaching the temporary stops can book the community minibus by calling the council office between 9 am "
    "and 4 pm. We are sorry for any inconvenience this may cause.\n\n"
    "Later, when the ferry had docked and the other passengers had hurried off towards the trains, Nell "
    "opened the suitcase on a bench in the waiting room. On top of the clocks, wrapped in a tea towel, lay "
    "a small pocket watch she had never seen before. Engraved inside the lid were her own initials and the "
    "year she was born. It was still ticking."
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


def invariance(mode: str, new_tokens: int = 16) -> str:
    """Per scenario (cached, batched beside long neighbours, chunked, compiled decode), how many prompts answer
    bitwise (tokens and logprobs) as they do cold, alone, eager and in one prefill chunk."""
    prompts = [c["input_ids"] for c in PROMPTS[:5]]
    neighbours = [c["input_ids"] * 4 for c in PROMPTS[5:12]]
    params = {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}

    def answers(engine: Engine, inputs: list[list[int]]) -> list[tuple[list[int], list[float]]]:
        outs = engine.generate(input_ids=inputs, sampling_params=params, return_logprob=True)
        return [(o.output_ids, [lp.logprob for lp in o.meta.output_logprobs]) for o in outs]

    with Engine(device="cpu", kv_cache_tokens=16384, quantization=mode, compile_layers=False) as engine:
        prompts.append(engine.tokenizer.encode(LONG_TEXT)[:600])
        alone = []
        for p in prompts:  # each cold (the chat prompts share their system turn): the cache emptied first
            engine.flush_cache()
            alone.append(answers(engine, [p])[0])
        cached = [answers(engine, [p])[0] for p in prompts]  # the last prompt's tokens cached, the others' prefixes
        batched = answers(engine, [*neighbours[:4], *prompts, *neighbours[4:]])[4:4 + len(prompts)]
        engine.check_invariants()
    with Engine(device="cpu", kv_cache_tokens=16384, quantization=mode, compile_layers=False,
                max_prefill_tokens=7) as engine:
        chunked = [answers(engine, [p])[0] for p in prompts]
    with Engine(device="cpu", kv_cache_tokens=16384, quantization=mode, compile_layers=True) as engine:
        compiled = []
        for p in prompts:  # the decode forward torch.compile'd (its norms and matmuls the same kernels as eager's)
            engine.flush_cache()
            compiled.append(answers(engine, [p])[0])
    same = {name: sum(a == b for a, b in zip(alone, runs))
            for name, runs in (("cached", cached), ("batched", batched), ("chunked", chunked), ("compiled", compiled))}
    return ", ".join(f"{name} {n}/{len(prompts)}" for name, n in same.items())


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
    parser.add_argument("--invariance", action="store_true", help="also the mode's invariances (issue 43)")
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
    if args.invariance:
        print(f"identical to cold and alone: {invariance(args.quantization)}")


if __name__ == "__main__":
    main()
