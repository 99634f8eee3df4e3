"""The server's bookkeeping: live request ids and token rates."""
from __future__ import annotations

import pytest

from radixlang.server.errors import APIError
from radixlang.server.state import LiveRequests, Throughput


class RecordingEngine:
    def __init__(self):
        self.aborted: list[str] = []

    def abort(self, rid: str) -> None:
        self.aborted.append(rid)


def test_throughput_is_the_counter_slope_over_the_window():
    meter = Throughput(window_s=10)
    assert meter.rates() == (0.0, 0.0)
    meter.add(0.0, 100, 1000)
    meter.add(4.0, 300, 1400)
    assert meter.rates() == (50.0, 100.0)
    meter.add(20.0, 300, 1400)  # idle for a while: the old burst leaves the window
    meter.add(25.0, 310, 1450)
    assert meter.rates() == pytest.approx((10 / 21, 50 / 21))  # from the sample at 4.0, the last before 15.0
    assert len(meter.samples) == 3


def test_live_requests_claim_release_and_abort_by_group_or_sample():
    engine = RecordingEngine()
    live = LiveRequests(engine)
    with live.claim({"a": ["a-0", "a-1"]}):
        with pytest.raises(APIError, match="'a' is already in use"):
            live.check({"a": ["a"]})
        with pytest.raises(APIError, match="'a-1' is already in use"):
            live.check({"a-1": ["a-1"]})
        assert live.abort("a") == 2 and live.abort("a-1") == 1 and live.abort("b") == 0
    assert engine.aborted == ["a-0", "a-1", "a-1"]
    assert not live.groups and not live.rids
    with pytest.raises(APIError, match="unique"):
        live.check({"x": ["y"], "y": ["y"]})
