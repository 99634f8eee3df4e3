"""Language tests share one tiny engine (building one takes about a second); each test starts with an
empty prefix cache and ends with the KV memory invariant checked."""
from __future__ import annotations

import pytest

import radixlang as rl


@pytest.fixture(scope="session")
def shared_tiny_engine(tiny_model_dir):
    from radixlang.runtime.engine import Engine

    engine = Engine(model=str(tiny_model_dir), kv_cache_tokens=8192, device="cpu")
    yield engine
    engine.check_invariants()
    engine.shutdown()


@pytest.fixture
def engine(shared_tiny_engine):
    shared_tiny_engine.flush_cache()
    yield shared_tiny_engine
    shared_tiny_engine.check_invariants()


@pytest.fixture
def backend(engine) -> rl.EngineBackend:
    return rl.EngineBackend(engine)


@pytest.fixture(scope="session")
def oracle_engine(tiny_model_dir):
    """The same tiny model without a prefix cache: every request computes its prompt from scratch."""
    from radixlang.runtime.engine import Engine

    engine = Engine(model=str(tiny_model_dir), kv_cache_tokens=8192, device="cpu", disable_radix_cache=True)
    yield engine
    engine.check_invariants()
    engine.shutdown()


@pytest.fixture(scope="session")
def server_url(shared_tiny_engine):
    """The HTTP server (server/) over the shared tiny engine, for the Endpoint client."""
    from radixlang.server.launch import background_server

    with background_server(shared_tiny_engine) as server:
        yield server.url


@pytest.fixture(scope="session")
def incremental_server_url(shared_tiny_engine):
    """As server_url, streaming as SGLang's incremental_streaming_output does (each event: only what is new)."""
    from radixlang.server.launch import background_server

    with background_server(shared_tiny_engine, incremental_streaming_output=True) as server:
        yield server.url
