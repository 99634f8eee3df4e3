"""Live weight updates (issue 46): after an update the engine computes as the new weights do (transformers on
them, in the exact mode; a fresh engine on them, in the default low-bit mode), no KV of the old weights is
reused, a mismatch leaves the old weights serving, and requests in flight finish on the old weights or abort."""
from __future__ import annotations

import functools
import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from radixlang.runtime.engine import Engine

from .models.gguf_tiny import Q, gguf_tensors, write_gguf
from .models.hf_tiny import BASE, one_thread, save_hf_model  # noqa: F401 (a fixture)

PROMPT = [72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 32, 84, 104]  # "Hello, world! Th"
GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
pytestmark = pytest.mark.usefixtures("one_thread")


def save_checkpoints(root: Path) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Two random checkpoints of one architecture saved by transformers (root/a, root/b; returned), and one of
    another shape (root/wide)."""
    config = transformers.LlamaConfig(**BASE)
    old, new = save_hf_model(root / "a", config, seed=1), save_hf_model(root / "b", config, seed=2)
    save_hf_model(root / "wide", transformers.LlamaConfig(**(BASE | {"intermediate_size": 256})), seed=3)
    return old, new


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("weights")
    return (root, *save_checkpoints(root))


@functools.cache  # each checkpoint's tokens are asked for by several tests
def hf_greedy(model: torch.nn.Module, n: int = GREEDY["max_new_tokens"]) -> list[int]:
    out = model.generate(torch.tensor([PROMPT]), max_new_tokens=n, do_sample=False, min_new_tokens=n)
    return out[0, len(PROMPT):].tolist()


def greedy(engine: Engine, **params) -> tuple[list[int], int]:
    done = engine.generate(input_ids=PROMPT, sampling_params=GREEDY | params)
    return done.output_ids, done.meta.cached_tokens


@pytest.fixture
def engine(checkpoints):
    engine = Engine(model=str(checkpoints[0] / "a"), device="cpu", kv_cache_tokens=2048, quantization="none",
                    compile_layers=False)
    yield engine
    engine.check_invariants()
    engine.shutdown()


def test_update_from_disk_serves_the_new_weights_and_no_old_kv(engine, checkpoints):
    root, old, new = checkpoints
    assert greedy(engine)[0] == hf_greedy(old)
    session = engine.generate(input_ids=PROMPT[:-2], sampling_params=GREEDY, cache_key="session")
    assert greedy(engine)[1] > 0  # the prompt is cached
    assert session.meta.completion_tokens and engine.stats()["kv_pins"] == 1

    result = engine.update_weights_from_disk(str(root / "b"), weight_version="step-1")

    assert (result.weight_version, engine.weight_version) == ("step-1", "step-1")
    assert engine.stats()["kv_pins"] == 0 and engine.stats()["kv_cached_tokens"] == 0
    assert greedy(engine) == (hf_greedy(new), 0)  # the new weights' tokens, none from the old KV
    assert engine.model_path == str(root / "b")


def test_update_from_tensor_changes_only_the_named_tensors(engine, checkpoints):
    _, old, new = checkpoints
    greedy(engine)  # cached before
    changed = ["model.layers.0.self_attn.k_proj.weight", "model.layers.1.mlp.up_proj.weight", "lm_head.weight"]
    given = {name: new.state_dict()[name] for name in changed}

    engine.update_weights_from_tensor(list(given.items()), weight_version="v2")

    mixed = transformers.LlamaForCausalLM(old.config).eval()
    mixed.load_state_dict(old.state_dict() | given)
    assert greedy(engine) == (hf_greedy(mixed), 0)
    assert engine.weight_version == "v2"


def test_a_low_bit_mode_repacks_the_tensors_it_takes(checkpoints):
    root, _, new = checkpoints
    options = {"device": "cpu", "kv_cache_tokens": 2048, "quantization": "int8", "compile_layers": False}
    with Engine(model=str(root / "b"), **options) as fresh:
        want = greedy(fresh)[0]
    with Engine(model=str(root / "a"), **options) as engine:
        assert type(engine.runner.model.layers[0].self_attn.qkv_proj).__name__ == "Int8Linear"
        assert greedy(engine)[0] != want
        engine.update_weights_from_tensor(list(new.state_dict().items()))
        assert greedy(engine) == (want, 0)  # as a fresh engine on the new weights
        engine.check_invariants()


def test_a_mismatch_is_refused_and_the_old_weights_serve_on(engine, checkpoints):
    root, old, _ = checkpoints
    greedy(engine)
    with pytest.raises(ValueError, match=r"gate_up_proj.*\(512, 64\).*\(256, 64\)"):
        engine.update_weights_from_disk(str(root / "wide"))
    with pytest.raises(ValueError, match="does not exist"):
        engine.update_weights_from_disk(str(root / "missing"))
    with pytest.raises(ValueError, match=r"k_proj.*\(3, 3\)"):
        engine.update_weights_from_tensor([("model.layers.0.self_attn.k_proj.weight", torch.zeros(3, 3))])
    with pytest.raises(ValueError, match="unknown weight"):
        engine.update_weights_from_tensor([("model.layers.9.mlp.up_proj.weight", torch.zeros(128, 64))])
    tokens, cached = greedy(engine)
    assert tokens == hf_greedy(old) and cached > 0  # nothing flushed: the update never began
    assert engine.weight_version == "default"


def test_requests_in_flight_finish_on_the_old_weights_and_new_ones_wait(engine, checkpoints, monkeypatch):
    root, old, new = checkpoints
    sub = engine.prepare(input_ids=PROMPT, sampling_params=GREEDY | {"max_new_tokens": 200}).requests[0]
    chunks = engine.chunks(sub)
    got = [next(chunks)]  # it runs
    # no step until the update holds new requests: else the 200 tokens may end while it still loads the checkpoint
    core, scheduler = engine._thread.core, engine.scheduler
    real_step = core.step
    monkeypatch.setattr(core, "step", lambda: real_step() if scheduler.hold_new else 0)
    update = threading.Thread(target=engine.update_weights_from_disk, args=(str(root / "b"),))
    update.start()
    wait_for(lambda: engine.scheduler.hold_new)  # the update waits for the running request
    later: list = []
    queued = threading.Thread(target=lambda: later.append(greedy(engine)))
    queued.start()  # while the update waits: queued until it is done
    got += list(chunks)
    update.join()
    monkeypatch.setattr(core, "step", real_step)
    queued.join()
    assert got[-1].finish_reason == "length"
    assert [t for c in got for t in c.token_ids] == hf_greedy(old, 200)  # all on the old weights
    assert later == [(hf_greedy(new), 0)]  # all on the new ones


def test_abort_all_requests_aborts_them_and_says_why(engine, checkpoints):
    root, _, new = checkpoints
    sub = engine.prepare(input_ids=PROMPT, sampling_params=GREEDY | {"max_new_tokens": 200}).requests[0]
    chunks = engine.chunks(sub)
    got = [next(chunks)]
    engine.pause_generation()  # it cannot finish before the update begins
    result = engine.update_weights_from_disk(str(root / "b"), abort_all_requests=True)
    engine.continue_generation()
    got += list(chunks)
    assert result.aborted == 1
    assert got[-1].finish_reason == "abort" and "weights are being updated" in got[-1].error
    assert greedy(engine) == (hf_greedy(new), 0)


def test_pause_in_abort_mode_aborts_what_runs(engine):
    chunks = engine.chunks(engine.prepare(input_ids=PROMPT, sampling_params=GREEDY | {"max_new_tokens": 200}).requests[0])
    got = [next(chunks)]
    assert engine.pause_generation("abort") == 1
    got += list(chunks)
    assert got[-1].finish_reason == "abort" and "paused" in got[-1].error
    with pytest.raises(ValueError, match="mode must be one of"):
        engine.pause_generation("retract")
    engine.continue_generation()
    assert greedy(engine)[0]  # it steps again


def wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


def test_pause_stops_the_steps_and_an_update_while_paused_retracts(engine, checkpoints):
    root, _, new = checkpoints
    engine.pause_generation()
    sub = engine.prepare(input_ids=PROMPT, sampling_params=GREEDY).requests[0]
    chunks = engine.chunks(sub)
    done = threading.Event()
    got: list = []

    def read() -> None:
        got.extend(chunks)
        done.set()

    reader = threading.Thread(target=read)
    reader.start()
    assert not done.wait(0.3) and engine.stats()["waiting_requests"] == 1  # queued, not run
    engine.update_weights_from_disk(str(root / "b"))  # paused: does not wait for the request
    engine.continue_generation()
    reader.join(30)
    assert got[-1].finish_reason == "length"
    assert greedy(engine)[0] == hf_greedy(new)


def test_the_default_low_bit_mode_switches_to_the_new_files_weights(tmp_path, checkpoints):
    _, old, new = checkpoints
    hf = json.loads((checkpoints[0] / "a" / "config.json").read_text())
    files = {}
    for name, model in (("a", old), ("b", new)):
        tensors, _ = gguf_tensors(hf, dict(model.state_dict()), Q.Q4_0, np.random.default_rng(0))
        files[name] = tmp_path / f"{name}.gguf"
        write_gguf(files[name], hf, tensors)
    options = {"device": "cpu", "kv_cache_tokens": 2048, "compile_layers": False}
    with Engine(model=str(files["b"]), **options) as fresh:
        want = greedy(fresh)[0]
    with Engine(model=str(files["a"]), **options) as engine:
        down = engine.runner.model.layers[0].mlp.down_proj
        assert type(down).__name__ in ("BlockLinear", "Int4Linear")  # the default mode packs the file's blocks
        before = greedy(engine)[0]
        assert before != want
        engine.update_weights_from_disk(str(files["b"]), load_format="gguf")
        assert greedy(engine) == (want, 0)
        with pytest.raises(ValueError, match="every part"):  # a packed linear takes its fused parts whole
            engine.update_weights_from_tensor([("model.layers.0.self_attn.q_proj.weight", torch.zeros(64, 64))])
        files["a"].write_bytes(files["b"].read_bytes())  # the same path, rewritten: its cache entry is stale
        engine.update_weights_from_disk(str(files["a"]))
        assert greedy(engine) == (want, 0)
        engine.check_invariants()
