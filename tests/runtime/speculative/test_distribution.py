"""Sampling with speculation follows the target distribution: the joint frequencies of the first three
sampled tokens, with a draft tree verified after the first (children accepted and rejected; a scripted
tree, or a draft model's top-k tree from the tiny model's own first layer), match the
distribution computed by a dense cache-free forward pass (chi-square at a fixed seed). A deliberately
wrong acceptance rule fails the same test."""
from __future__ import annotations

import functools
import math
import os
from collections import Counter

import pytest
import torch

from radixlang.runtime.draft_tree import DraftTree
from radixlang.runtime.execution import output_processor
from radixlang.runtime.request import Req

from ...conftest import TINY_CONFIG, tiny_weights
from ..models.test_llama import dense_logits
from .scripted import ScriptedDrafter, draft_every_step

TOP_K = 3  # a small effective vocabulary: 27 joint cells for three tokens
SAMPLES = int(os.environ.get("SPEC_SAMPLES", 2000))
TEMPERATURE = 1.5
PARAMS = {"temperature": TEMPERATURE, "top_k": TOP_K, "max_new_tokens": 5, "ignore_eos": True}


def target(prefix: list[int]) -> dict[int, float]:
    """p(next | prefix) after temperature and top-k, from the dense oracle."""
    return _target(tuple(prefix))


@functools.lru_cache(maxsize=None)
def _target(prefix: tuple[int, ...]) -> dict[int, float]:
    logits = dense_logits(WEIGHTS, TINY_CONFIG, list(prefix))[-1].double()
    top = torch.topk(logits, TOP_K)
    probs = torch.softmax(top.values / TEMPERATURE, dim=0)
    return dict(zip(top.indices.tolist(), probs.tolist()))


WEIGHTS = tiny_weights(TINY_CONFIG)


class TopTreeDrafter(ScriptedDrafter):
    """After the first token t1 proposes, as siblings, the target's 2nd and 1st choices, and under the
    1st its own 1st choice: every draw outcome (accept either child, the grandchild, or none) occurs."""

    def __init__(self, prompt: list[int]):
        self.prompt = prompt

    def propose_one(self, req: Req, room: int) -> DraftTree:
        if len(req.output_ids) != 1 or room < 3:
            return DraftTree([], [])
        ctx = self.prompt + req.output_ids
        first, second = sorted(target(ctx), key=target(ctx).get, reverse=True)[:2]
        grand = max(target(ctx + [first]).items(), key=lambda kv: kv[1])[0]
        return DraftTree([second, first, grand], [-1, -1, 1])



def expected_joint(prompt: list[int]) -> dict[tuple[int, int, int], float]:
    out = {}
    for t1, p1 in target(prompt).items():
        for t2, p2 in target(prompt + [t1]).items():
            for t3, p3 in target(prompt + [t1, t2]).items():
                out[(t1, t2, t3)] = p1 * p2 * p3
    return out


def chi_square_critical(dof: int, z: float = 3.09) -> float:
    """The chi-square quantile for upper tail 1e-3 (z = 3.09), by Wilson-Hilferty."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


SELF_DRAFT = {"speculative_algorithm": "SELF", "speculative_draft_layers": 1, "speculative_eagle_topk": 2}
DRAFTERS = ["scripted", "self-draft"]  # TopTreeDrafter's trees; the tiny model's first layer's top-k trees


def sample_joint(factory, kind: str, prompt: list[int]) -> tuple[Counter, dict[str, float]]:
    if kind == "scripted":
        engine = factory(seed=1234, max_running_requests=128)
        engine.core.set_drafter(TopTreeDrafter(prompt))
    else:
        engine = factory(seed=1234, max_running_requests=128, **SELF_DRAFT)
        draft_every_step(engine.scheduler.drafter)
    outs = engine.generate(input_ids=[prompt] * SAMPLES, sampling_params=PARAMS)
    return Counter(tuple(o.output_ids[:3]) for o in outs), engine.stats()


def chi_square(observed: Counter, expected: dict[tuple[int, int, int], float]) -> float:
    assert set(observed) <= set(expected), "a sampled token outside the top-k"
    return sum((observed[cell] - SAMPLES * p) ** 2 / (SAMPLES * p) for cell, p in expected.items())


@pytest.fixture(scope="module")
def prompt(tokenizer) -> list[int]:
    return tokenizer.encode("The quick brown fox")


@pytest.mark.parametrize("kind", DRAFTERS)
def test_speculative_sampling_matches_the_target_distribution(tiny_engine_factory, prompt, kind):
    expected = expected_joint(prompt)
    observed, stats = sample_joint(tiny_engine_factory, kind, prompt)
    accepted = stats["spec_accepted_tokens_total"] / SAMPLES
    if kind == "scripted":
        assert stats["spec_verify_steps_total"] == SAMPLES
        assert 0.3 < accepted < 1.9, "drafts were both accepted and rejected"
    else:
        assert stats["spec_verify_steps_total"] >= SAMPLES
        assert 0.1 < accepted and stats["spec_draft_tokens_total"] > 2 * stats["spec_accepted_tokens_total"]
    stat, critical = chi_square(observed, expected), chi_square_critical(len(expected) - 1)
    assert stat < critical, f"chi-square {stat:.1f} >= {critical:.1f}"


def first_child_when_any_child(tokens: list[int], parents: list[int], drawn: list[int]) -> list[int]:
    """Wrong: when the draw matches any child, the first proposed child is kept (sibling mass collapses)."""
    path, node = [], -1
    while True:
        kids = [i for i, p in enumerate(parents) if p == node]
        if not any(tokens[i] == drawn[node + 1] for i in kids):
            return path
        path.append(kids[0])
        node = kids[0]


def test_a_wrong_acceptance_rule_fails_the_same_test(tiny_engine_factory, prompt, monkeypatch):
    """On the scripted tree, whose first child is the target's 2nd choice (a draft model's first child is
    mostly the target's draw too, which hides this bug)."""
    monkeypatch.setattr(output_processor, "accept_path", first_child_when_any_child)
    expected = expected_joint(prompt)
    observed, _ = sample_joint(tiny_engine_factory, "scripted", prompt)
    stat, critical = chi_square(observed, expected), chi_square_critical(len(expected) - 1)
    assert stat > critical, f"chi-square {stat:.1f} <= {critical:.1f}"
