"""The python blocks of the README and the guides run, page by page, each page's blocks in order as one
session, on the shared SmolLM2 engine: `rl.Runtime()` and `Engine()` stand for that engine, and the
address of `radixlang serve` in a block is a live server on it. Each block's printed output is checked for
what the page says it prints (the blocks themselves and how many run: tests/doc_snippets.py)."""
from __future__ import annotations

import pytest

import radixlang as rl
from radixlang.server.launch import background_server
from tests.doc_snippets import RUNNABLE, python_blocks

pytestmark = pytest.mark.e2e
SERVED_AT = "http://127.0.0.1:30000"  # `radixlang serve --port 30000`, as the pages start it

# page -> {block index among its tested blocks: strings its output contains}
OUTPUTS = {
    "README.md": {0: ["The capital of France is Paris.", " Paris"],
                  1: ["'name': 'get_temperature'", "'city': 'Oslo'"],
                  2: ["Paris"]},
    "docs/language.md": {0: ["The capital of France is Paris.", "'role': 'assistant'"],
                         1: ["Paris"],
                         3: ["TypeError('cannot append int"],
                         4: ["['question']", "text", " end"]},
    "docs/engine.md": {0: ["Paris", "length 16"]},
    "docs/constrained.md": {0: ['"name"', "Age: "],
                            1: ['False {"b":true,"a":1} True', 'True {"b":true,"a":1} False',
                                'True {"a":1,"note":"x"} False', "('property order at #',)"]},
    "docs/agents.md": {0: ["True\nTrue\n"]},
    "docs/server.md": {0: ["The capital of France is Paris."],
                       1: ["tool_calls get_weather {'city': 'Paris'}"]},
}


class SharedRuntime(rl.EngineBackend):
    """Stands in for `rl.Runtime()`: the session's engine; `shutdown()` leaves it running."""

    def shutdown(self) -> None:
        self.engine.check_invariants()


class SharedEngine:
    """Stands in for `Engine()`: the session's engine, which outlives the example."""

    def __init__(self, engine) -> None:
        self._engine = engine

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def __enter__(self) -> "SharedEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        self._engine.check_invariants()


def engine_class(engine) -> type:
    """`Engine` as the pages call it: a class (lang checks `isinstance(x, Engine)`) whose instances are the
    session's engine."""

    class Engine(SharedEngine):
        def __new__(cls, *args: object, **options: object) -> SharedEngine:  # type: ignore[misc]
            return SharedEngine(engine)

    return Engine


@pytest.fixture(scope="module")
def served_url(smollm_engine):
    with background_server(smollm_engine) as server:
        yield server.url


@pytest.mark.parametrize("page", sorted(RUNNABLE))
def test_page_python_blocks_run(page, smollm_engine, served_url, monkeypatch, capsys):
    import radixlang.runtime.engine as engine_module

    monkeypatch.setattr(rl, "Runtime", lambda *a, **k: SharedRuntime(smollm_engine))
    monkeypatch.setattr(engine_module, "Engine", engine_class(smollm_engine))
    monkeypatch.setattr(rl.global_config, "default_backend", None)
    blocks = [b for b in python_blocks(page) if b.tested]
    assert len(blocks) == RUNNABLE[page] > 0
    namespace: dict = {}
    outputs = []
    for block in blocks:
        code = block.code.replace(SERVED_AT, served_url)
        exec(compile("\n" * (block.line) + code, page, "exec"), namespace)  # noqa: S102 - the page's own code
        outputs.append(capsys.readouterr().out)
    for index, needles in OUTPUTS[page].items():
        for needle in needles:
            assert needle in outputs[index], f"{page}, block {index}: {needle!r} not in {outputs[index]!r}"
    if page == "docs/agents.md":  # the HTTP example's session pinned its history: released here
        assert smollm_engine.release_cache_key("trip-2") > 0
