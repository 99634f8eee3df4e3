"""The per-request Matcher's step bitmask, built from stored bits, against packing the bool mask."""
from __future__ import annotations

import random

import numpy as np
import pytest

from radixlang.runtime.constrained.matcher import Matcher
from radixlang.testing.masks import pack_mask

SPECS = [("regex", r'\{"a":[0-9]{1,3}(,"b":"[a-z]{0,4}")?\}', b'{"a":12}'),
         ("json_schema", {"type": "object", "properties": {"kid": {"$ref": "#"}, "n": {"type": "integer"}}},
          b'{"kid":{},"n":3}'),
         ("grammar", 'start: "x" start | "y"', b"xxy")]


def expected_words(constraint, state, end_ids) -> np.ndarray:
    allowed = constraint.allowed(state)
    if constraint.can_end(state):
        allowed[list(end_ids)] = True
    return pack_mask(allowed)


@pytest.mark.parametrize("kind,spec,text", SPECS, ids=[k for k, _, _ in SPECS])
def test_mask_words_match_the_packed_bool_mask_with_eos_where_the_output_may_end(compiler, kind, spec, text):
    constraint = compiler.compile(kind, spec)
    end_ids = constraint.vocab.end_ids
    matcher = Matcher(constraint, end_ids)
    rng = random.Random(0)
    for _ in range(12):
        state = matcher.state
        assert np.array_equal(matcher.mask_words(state), expected_words(constraint, state, end_ids))
        choices = np.flatnonzero(constraint.allowed(state))
        if not choices.size:
            break
        assert matcher.advance(int(choices[rng.randrange(choices.size)]))
    prefixes = [constraint.advance_bytes(constraint.initial(), text[:n]) for n in range(len(text) + 1)]
    assert constraint.can_end(prefixes[-1])
    for state in prefixes:
        assert np.array_equal(matcher.mask_words(state), expected_words(constraint, state, end_ids))
