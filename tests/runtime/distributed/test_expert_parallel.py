"""Expert parallelism over the tensor-parallel ranks (gloo, real worker processes): each rank holds half
the experts and the (token, expert) rows travel by all_to_all; greedy tokens and logprobs equal one rank's."""
from __future__ import annotations

import functools
from pathlib import Path

import pytest

from radixlang.runtime.completion import Completion
from radixlang.runtime.engine import Engine
from tests.runtime.models.hf_tiny import one_thread
from tests.runtime.models.test_moe_parity import build, prompts

pytestmark = pytest.mark.usefixtures(one_thread.__name__)  # the fixture, imported

GREEDY = {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True}


def _generate(engine: Engine) -> list[Completion]:
    return engine.generate(input_ids=prompts(7), sampling_params=GREEDY, return_logprob=True, top_logprobs_num=3)


def _run(folder: Path, **options) -> list[Completion]:
    with Engine(str(folder), device="cpu", kv_cache_tokens=1024, max_prefill_tokens=64, **options) as engine:
        out = _generate(engine)
        engine.check_invariants()
    return out


def _assert_same(one: list[Completion], other: list[Completion]) -> None:
    assert [o.output_ids for o in other] == [o.output_ids for o in one]
    for a, b in zip(one, other, strict=True):
        for x, y in zip(a.meta.output_logprobs, b.meta.output_logprobs, strict=True):
            assert [t for t, _ in x.top] == [t for t, _ in y.top]
            assert max(abs(p - q) for (_, p), (_, q) in zip(x.top, y.top, strict=True)) < 1e-4


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    """name -> (its folder, its outputs on one rank): each family built and run once for the module."""
    root = tmp_path_factory.mktemp("ep")

    @functools.cache
    def folder_and_outputs(name: str) -> tuple[Path, list[Completion]]:
        build(root, name)
        return root / name, _run(root / name)

    return folder_and_outputs


@pytest.mark.parametrize("name, options", [
    ("mixtral", dict(tp_size=4)),  # 4 experts: one per rank; 2 KV heads replicated over 4 ranks
    ("qwen2-moe", dict(tp_size=2, ep_size=1)),  # --ep 1: each rank holds half of every expert's units
    ("deepseek-v3", dict(tp_size=2)),  # MLA: 2 of 4 query heads per rank over the same latent; 4 experts each
], ids=["ep4", "tp2-ep1", "deepseek-ep2"])
def test_ep_greedy_tokens_and_logprobs_match_ep1(one_rank, name, options):
    folder, one = one_rank(name)
    _assert_same(one, _run(folder, **options))


def test_experts_that_do_not_split_over_the_ranks_are_refused(tmp_path):
    build(tmp_path, "qwen3-moe")  # 6 experts
    with pytest.raises(Exception, match="ep_size 4"):
        Engine(str(tmp_path / "qwen3-moe"), device="cpu", kv_cache_tokens=256, tp_size=4)
    with pytest.raises(ValueError, match="ep_size must be 1 or tp_size"):
        Engine(str(tmp_path / "qwen3-moe"), device="cpu", kv_cache_tokens=256, tp_size=4, ep_size=2)


def test_ep2_and_eplb_under_ep_keep_ep1_outputs(one_rank):
    """EP 2 (4 experts + a shared expert, 2 per rank; layer 0 dense, tensor-parallel) gives EP 1's outputs;
    then a placement with replicas applied on both ranks (each gathers the experts its new physical slots
    run) keeps them."""
    folder, one = one_rank("qwen2-moe")  # 4 experts -> 6 physical: 3 per rank, two replicas
    with Engine(str(folder), device="cpu", kv_cache_tokens=1024, max_prefill_tokens=64, tp_size=2) as engine:
        before = _generate(engine)
        with pytest.raises(ValueError, match="ep_size 2"):
            engine.rebalance_experts(num_physical=6, num_ranks=4)
        placements = engine.rebalance_experts(num_physical=6)
        after = _generate(engine)
        engine.check_invariants()
    assert all(p.num_ranks == 2 and sorted(set(p.phys_to_logical)) == [0, 1, 2, 3] for p in placements)
    _assert_same(one, before)
    _assert_same(one, after)
