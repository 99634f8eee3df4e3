"""The pacing cost model against schedules written out by hand."""
from __future__ import annotations

import math

import pytest

from radixlang.runtime.config import SPEC_PROBE_SHARE
from radixlang.runtime.speculative.pacing import Pacing


def chances(pacing: Pacing, n: int, accepted: int) -> list[bool]:
    """Whether each of n chances drafted; each draft's verify accepts `accepted` tokens."""
    out = []
    for _ in range(n):
        out.append(pacing.ready())
        if out[-1]:
            pacing.verified(accepted)
    return out


def test_verifies_that_do_not_pay_back_off_exponentially_up_to_the_cap():
    pacing = Pacing(break_even=1.0, max_skip=5)
    # averages 1.4 (pays), 0.98, 0.69, 0.48, ...: sit out 1, 3, then 5 (the cap) chances
    assert chances(pacing, 20, 0) == [True, True, False, True, False, False, False, True] + [False] * 5 \
        + [True] + [False] * 5 + [True]


def test_a_probe_that_pays_ends_the_back_off():
    pacing = Pacing(break_even=1.5, max_skip=5)
    chances(pacing, 4, 0)
    assert pacing.skip > 0
    while not pacing.ready():
        pass
    pacing.verified(2)  # the average stays below 1.5, but this verify paid
    assert pacing.accepted < 1.5
    assert pacing.skip == 0
    assert chances(pacing, 3, 1) == [True, False, True]  # the next miss backs off from 1 again, not 7


@pytest.mark.parametrize("break_even", [0.5, 1.0, 2.7])
def test_probes_cost_about_their_share_once_backed_off(break_even):
    pacing = Pacing.for_cost(break_even)
    assert pacing.max_skip == math.ceil(break_even / SPEC_PROBE_SHARE)
    drafted = chances(pacing, 20_000, 0)
    tail = drafted[10_000:]  # after the ramp: one probe every max_skip + 1 chances
    assert sum(tail) * break_even / len(tail) == pytest.approx(SPEC_PROBE_SHARE, rel=0.1)


def test_tree_size_follows_the_accepted_average():
    pacing = Pacing(break_even=1.0, max_skip=5, accepted=3.2)
    assert pacing.budget(16) == 7
    assert pacing.budget(4) == 4
    assert Pacing(break_even=1.0, max_skip=5, accepted=0.2).budget(16) == 1


def test_requests_sharing_one_record_probe_no_more_than_one_request_would():
    alone = chances(Pacing.for_cost(1.0), 8 * 500, 0)
    shared, drafted = Pacing.for_cost(1.0), []
    for _ in range(500):  # a batch of 8: the step's verifies come after all its chances
        step = [shared.ready() for _ in range(8)]
        for ok in step:
            if ok:
                shared.verified(0)
        drafted += step
    assert sum(drafted) <= sum(alone) + 8  # only the first step, before any verify, drafts for everyone
    assert drafted[:8] == [True] * 8
