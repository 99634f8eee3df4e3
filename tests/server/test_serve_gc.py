"""`radixlang serve` freezes what the loaded engine holds, so the cyclic collector's full passes skip it."""
import gc

from radixlang.server.cli import main


class _Engine:
    def __init__(self, **options) -> None:
        self.weights = [[] for _ in range(100)]  # long-lived containers, as a model's are

    def __enter__(self) -> "_Engine":
        return self

    def __exit__(self, *exc) -> None:
        pass


def test_serve_freezes_the_loaded_engine_before_it_serves(monkeypatch):
    seen: dict[str, bool] = {}

    def serve(engine, *args, **kwargs) -> None:
        tracked = {id(o) for o in gc.get_objects()}  # the generations a collection walks, not the frozen one
        seen["engine scanned"] = id(engine) in tracked
        seen["weights scanned"] = any(id(w) in tracked for w in engine.weights)

    monkeypatch.setattr("radixlang.runtime.engine.Engine", _Engine)
    monkeypatch.setattr("radixlang.server.launch.serve", serve)
    try:
        assert main(["serve"]) == 0
    finally:
        gc.unfreeze()  # this test process's objects go back to the collector
    assert seen == {"engine scanned": False, "weights scanned": False}
