"""Fixtures for constrained decoding: the real vocabulary as bytes, a tiny engine shared per module."""
from __future__ import annotations

import pytest

from radixlang.runtime.constrained.compiler import ConstraintCompiler
from radixlang.runtime.constrained.masks.vocab import TokenVocab


@pytest.fixture(scope="session")
def vocab(tokenizer) -> TokenVocab:
    return TokenVocab.from_tokenizer(tokenizer, tokenizer.vocab_size)


@pytest.fixture(scope="session")
def compiler(vocab) -> ConstraintCompiler:
    return ConstraintCompiler(lambda: vocab)


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_dir):
    """One tiny-model engine per test module (compiling constraints once); checked at the end."""
    from radixlang.runtime.engine import Engine

    engine = Engine(model=str(tiny_model_dir), device="cpu", kv_cache_tokens=4096)
    yield engine
    engine.check_invariants()
    engine.shutdown()


def random_walk(constraint, rng, max_tokens: int = 200) -> tuple[bytes, bool]:
    """Feeds random allowed tokens (often single bytes, so strings close) until the constraint may
    end and a coin says stop. Returns (bytes, whether the output is complete)."""
    import numpy as np

    state, out = constraint.initial(), bytearray()
    single = constraint.vocab.lengths == 1
    # from a random step on, the shortest completion byte by byte (where the constraint knows it): an open
    # object's undeclared keys, allowed anywhere, would else crowd out its required members
    closing = getattr(constraint, "closing_bytes", None)
    closing_now = False
    for _ in range(max_tokens):
        allowed = constraint.allowed(state)
        if constraint.can_end(state) and (rng.random() < 0.4 or not allowed.any()):
            return bytes(out), True
        ids = constraint.vocab.ids[allowed[constraint.vocab.ids] & single]
        closing_now = closing_now or rng.random() < 0.03
        rest = closing(state, 256, nonempty=True) if closing is not None and closing_now else None
        if rest and rest[:1] in constraint.vocab.by_bytes and allowed[constraint.vocab.by_bytes[rest[:1]]]:
            ids = np.array([constraint.vocab.by_bytes[rest[:1]]])
        elif rng.random() < 0.3 or not ids.size:
            ids = np.flatnonzero(allowed)
        token = int(ids[rng.randrange(ids.size)])
        nxt = constraint.advance(state, token)
        assert nxt is not None, f"mask allowed token {token} that advance rejects"
        state = nxt
        out += constraint.vocab.bytes_of(token)
    return bytes(out), False


@pytest.fixture(scope="session")
def walk():
    return random_walk
