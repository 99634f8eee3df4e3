"""The end-to-end tests share one SmolLM2 engine (session-scoped): each test that used it ends with
the KV memory invariant checked, so a leak is pinned to the test that made it."""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def smollm_invariant_after_each_test(request):
    yield
    if "smollm_engine" in request.fixturenames:
        request.getfixturevalue("smollm_engine").check_invariants()
