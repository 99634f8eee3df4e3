"""A tiny CLIP LLaVA folder (saved by transformers) and an engine on it, shared by these tests."""
from __future__ import annotations

import pytest

from radixlang.runtime.engine import Engine

from .llava_tiny import save_llava


@pytest.fixture(scope="session")
def clip_llava(tmp_path_factory):
    """(folder, the transformers model saved there)."""
    path = tmp_path_factory.mktemp("llava") / "clip"
    return path, save_llava(path)


@pytest.fixture(scope="module")
def engine(clip_llava):
    with Engine(str(clip_llava[0]), kv_cache_tokens=2048) as e:
        yield e
        e.check_invariants()  # whatever the module's tests did, no KV slot leaked
