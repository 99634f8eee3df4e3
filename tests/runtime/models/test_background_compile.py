"""The compiled decode forward, built in a background thread while the engine serves eagerly, gives the
eager forward's tokens; compile_layers="auto" compiles only once a compile of the model finished here; a
compile still running is cancelled, so that the engine stays eager and the process exits cleanly."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor.runtime.cache_dir_utils import default_cache_dir

from radixlang.runtime.config import EngineConfig
from radixlang.runtime.engine import Engine
from radixlang.runtime.models import compiled as compiled_module

from ...conftest import STALL_THE_COMPILE, TINY_CONFIG, tiny_weights, write_hf_folder

GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
# the tiny model with biases on its MLP's linears: a graph of the tiny model would leave them out, and no guard on
# the inputs or the attention plan (the same shapes) tells the two apart
OTHER_CONFIG = TINY_CONFIG | {"mlp_bias": True}

PROMPTS = ["The history of the printing press", "1, 2, 3, 4, 5,", "Once upon a time"]

EXIT_MID_COMPILE = STALL_THE_COMPILE + """
import sys
from radixlang.runtime.engine import Engine

engine = Engine(sys.argv[1], device="cpu", kv_cache_tokens=256, compile_layers=True)
assert STALLED.wait(120), "the compile never reached torch's tracing"
if sys.argv[2] == "shutdown":
    engine.shutdown()
    job = engine.decode_compile
    print(job.state, job.marker.exists(), job.thread.is_alive())
"""


def with_mlp_biases(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    biases = {name.replace(".weight", ".bias"): torch.randn(len(w), generator=g)
              for name, w in weights.items() if ".mlp." in name}
    return weights | biases


def count_compiled_calls(compiler: compiled_module.BackgroundCompile) -> list[int]:
    """A list that grows by one at each call of the compiled forward from now on."""
    calls: list[int] = []
    compiled = compiler.compiled
    assert compiled is not None
    compiler.compiled = lambda *a: calls.append(1) or compiled(*a)
    return calls


def settled_graph_count() -> int:
    """dynamo's count of compiled graphs, once no other engine of this process compiles in the background (the
    count is process-wide: another session engine's compile landing during the live steps read as a recompile)."""
    for job in list(compiled_module._LIVE):
        if job.thread.ident is not None and job.thread.is_alive():
            job.finished.wait(timeout=600)
    return counters["stats"]["unique_graphs"]


def test_compile_layers_choices_are_checked():
    assert EngineConfig.from_options(compile_layers="off").compile_layers is False
    assert EngineConfig.from_options(compile_layers="auto").compiles_decode(warm=True)
    assert not EngineConfig.from_options().compiles_decode(warm=False)
    assert not EngineConfig.from_options(compile_layers=True, device="meta").compiles_decode(warm=False)
    with pytest.raises(ValueError, match="compile_layers must be"):
        EngineConfig.from_options(compile_layers="sometimes")


def answers(engine: Engine) -> list[tuple[list[int], list[float]]]:
    """Each prompt's greedy tokens and their logprobs (any change in a row's logits shows in its logprobs)."""
    outs = engine.generate(PROMPTS, GREEDY, return_logprob=True)
    return [(o.output_ids, [lp.logprob for lp in o.meta.output_logprobs]) for o in outs]


def switch_after(compiler: compiled_module.BackgroundCompile, eager_decodes: int) -> None:
    """Serves the next `eager_decodes` decode steps eagerly, then switches to the compiled forward between two
    steps, as the background thread's `ready` does when its compile lands in the middle of a request."""
    eager, seen = compiler.eager, []

    def counting(input_ids, positions, ctx, embeds=None):
        if getattr(ctx.attn, "decode_only", False):
            seen.append(1)
            compiler.ready = len(seen) >= eager_decodes
        return eager(input_ids, positions, ctx, embeds)

    compiler.ready, compiler.eager = False, counting


@pytest.mark.parametrize("mode", ["none", "int4"])  # fp32 on dense_mm (the exact mode), the block kernel (default's)
def test_compiled_decode_gives_eager_tokens_and_logprobs_bit_for_bit_and_so_does_a_switch_mid_request(
        tiny_model_dir, monkeypatch, mode):
    """Inductor fused each RMSNorm into the residual add before it and reduced in its own order: the logprobs moved
    in the last bits once the background compile switched over, mid-request too (issue 43). The oracle: an engine
    that never compiles."""
    # one warm-up graph, the one these prompts' decodes take (3 rows of unequal lengths): CI compiles once per mode
    monkeypatch.setattr(compiled_module, "WARMUP_STEPS", ((3, (3, 5, 4)),))
    options = {"device": "cpu", "kv_cache_tokens": 1024, "quantization": mode}
    with Engine(str(tiny_model_dir), **options, compile_layers=False) as eager:
        want = answers(eager)
        eager.check_invariants()
    with Engine(str(tiny_model_dir), **options, compile_layers=True) as engine:
        compiler = engine.decode_compile
        before = answers(engine)  # eager, or compiled if it was quick
        assert compiler.finished.wait(timeout=600) and compiler.ready, compiler.error
        compiler.marker.unlink()  # so the session's later engines on the tiny model stay eager under "auto"
        calls = count_compiled_calls(compiler)
        graphs = settled_graph_count()
        after = answers(engine)
        compiled_steps = len(calls)
        switch_after(compiler, eager_decodes=3)
        switched = answers(engine)
        engine.check_invariants()
    assert before == want and after == want
    assert switched == want
    assert counters["stats"]["unique_graphs"] == graphs  # the live steps took the warm-up's graph: no recompile
    assert compiled_steps >= GREEDY["max_new_tokens"] - 1  # the decode steps ran the compiled forward
    assert len(calls) - compiled_steps >= GREEDY["max_new_tokens"] - 1 - 3  # ... and after the switch


def test_batches_past_a_layers_dense_switch_take_warmed_up_graphs(tiny_model_dir, monkeypatch):
    """A packed linear runs its dense copy from `dense_min_rows` rows on, a branch the compiled graph guards on:
    the warm-up compiles that side too, so the first live batch that large does not recompile (SmolLM2 `auto`
    recompiled for ~20 s on the scheduler thread at its first 7-row batch)."""
    from radixlang.runtime.models.linear import quant

    monkeypatch.setattr(quant, "DENSE_MIN_ROWS", 4)  # int8 layers: the packed kernel below 4 rows, dense from 4
    monkeypatch.setattr(compiled_module, "WARMUP_STEPS", ((3, (3, 5, 4)),))  # one graph below the switch
    prompts = [*PROMPTS, "Red, green", "A list of the planets, from the sun outwards:"]  # 5 unequal rows
    options = {"device": "cpu", "kv_cache_tokens": 1024, "quantization": "int8"}
    with Engine(str(tiny_model_dir), **options, compile_layers=True) as engine:
        compiler = engine.runner.model.forward.__self__
        assert [batch for batch, _ in compiler._steps] == [3, 4, 4]  # the switch's side: equal and unequal rows
        assert compiler.finished.wait(timeout=600) and compiler.ready, compiler.error
        graphs = settled_graph_count()
        calls = count_compiled_calls(compiler)
        engine.generate(prompts, GREEDY)  # tokens: the test above (a random model's near ties flip across runs)
        engine.check_invariants()
    compiler.marker.unlink()
    assert len(calls) >= GREEDY["max_new_tokens"] - 1  # the 5-row decode steps ran compiled
    assert counters["stats"]["unique_graphs"] == graphs  # ... on the warmed graph of the dense side


def test_two_models_compiled_in_one_process_each_run_their_own_graphs(tiny_model_dir, tmp_path, tokenizer,
                                                                      monkeypatch):
    """Each model's compiled forward has a code object of its own, which holds its graphs, so the guards on its
    modules can be dropped (compiled.own_code): a second model must still get a graph of its own, not the
    first's with its weights fed in."""
    monkeypatch.setattr(compiled_module, "WARMUP_STEPS", ((3, (3, 5, 4)),))
    other = write_hf_folder(tmp_path / "other", OTHER_CONFIG, with_mlp_biases(tiny_weights(OTHER_CONFIG)), tokenizer)
    want = {}
    for path in (tiny_model_dir, other):
        with Engine(str(path), device="cpu", kv_cache_tokens=1024, compile_layers=False) as eager:
            want[path] = [o.output_ids for o in eager.generate(PROMPTS, GREEDY)]
            eager.check_invariants()
    assert want[tiny_model_dir] != want[other]
    engines = {path: Engine(str(path), device="cpu", kv_cache_tokens=1024, compile_layers=True)
               for path in (tiny_model_dir, other)}
    try:
        for path, engine in engines.items():
            compiler = engine.decode_compile
            assert compiler.finished.wait(timeout=600) and compiler.ready, compiler.error
            compiler.marker.unlink(missing_ok=True)  # later engines on these models stay eager under "auto"
            calls = count_compiled_calls(compiler)
            assert [o.output_ids for o in engine.generate(PROMPTS, GREEDY)] == want[path]
            assert len(calls) >= GREEDY["max_new_tokens"] - 1  # the decode steps ran the compiled forward
            engine.check_invariants()
    finally:
        for engine in engines.values():
            engine.shutdown()


def test_the_triton_backend_on_a_cpu_never_compiles():
    # Triton on a CPU is its interpreter: a compile beside the engine's steps broke them
    assert not EngineConfig.from_options(compile_layers=True, attention_backend="triton").compiles_decode(warm=True)
    assert EngineConfig.from_options(compile_layers=True, attention_backend="torch").compiles_decode(warm=False)


def test_compile_artefacts_go_to_our_cache_folder_unless_the_user_chose_one(monkeypatch, tmp_path):
    monkeypatch.setenv("RADIXLANG_CACHE_DIR", str(tmp_path))
    # importing torch._dynamo (this module did) sets the variable to inductor's own /tmp default: no choice
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    compiled_module.use_our_inductor_cache()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    compiled_module.use_our_inductor_cache()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "chosen"))
    compiled_module.use_our_inductor_cache()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "chosen")


def test_gil_turns_are_short_while_any_compile_runs_and_restored_after_the_last():
    # the serving thread takes the GIL back after each torch op: a compile thread's 5 ms turns slowed eager steps
    default = sys.getswitchinterval()
    first, second = compiled_module.short_gil_turns(), compiled_module.short_gil_turns()
    with first:
        assert sys.getswitchinterval() == pytest.approx(compiled_module.COMPILING_SWITCH_INTERVAL_S)
        second.__enter__()  # a second engine's compile overlaps the first and outlives it
    assert sys.getswitchinterval() == pytest.approx(compiled_module.COMPILING_SWITCH_INTERVAL_S)
    second.__exit__(None, None, None)
    assert sys.getswitchinterval() == default


@pytest.mark.parametrize("shutdown", [True, False], ids=["shutdown", "exit without shutdown"])
def test_a_process_exits_cleanly_while_its_background_compile_runs(tiny_model_dir, tmp_path, shutdown):
    # a thread left inside the compiler when the interpreter exits is frozen under torch's C++: exit 134
    env = dict(os.environ, RADIXLANG_CACHE_DIR=str(tmp_path))  # nothing compiled yet: no marker, cold caches
    res = subprocess.run([sys.executable, "-c", EXIT_MID_COMPILE, str(tiny_model_dir),
                          "shutdown" if shutdown else "exit"], capture_output=True, text=True, env=env, timeout=300)
    assert "terminate called" not in res.stderr and res.returncode == 0, res.stderr[-3000:]
    if shutdown:  # cancelled, its thread gone, and no marker: the next engine does not take it for compiled
        assert res.stdout.split() == ["cancelled", "False", "False"]


def test_a_cancelled_compile_leaves_the_engine_serving_eagerly_and_writes_no_marker(tiny_model_dir, monkeypatch):
    monkeypatch.setattr(compiled_module, "WARMUP_STEPS", ((3, (3, 5, 4)),))
    torch._dynamo.reset()  # the forward's graphs compiled by earlier tests: the compile would end before it is seen
    with Engine(str(tiny_model_dir), device="cpu", kv_cache_tokens=1024, compile_layers=False) as eager:
        want = [o.output_ids for o in eager.generate(PROMPTS, GREEDY)]
    with Engine(str(tiny_model_dir), device="cpu", kv_cache_tokens=1024, compile_layers=True) as engine:
        job = engine.decode_compile
        _wait_until_inside_torch(job.thread)
        job.stop()
        assert job.state == "cancelled" and not job.ready and not job.thread.is_alive(), job.error
        assert not job.marker.exists()
        got = [o.output_ids for o in engine.generate(PROMPTS, GREEDY)]
        engine.check_invariants()
    assert got == want


def _wait_until_inside_torch(thread: threading.Thread) -> None:
    """Until `thread` runs torch's code (the compile proper, past our own set-up)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(thread.ident)
        while frame is not None and "torch" + os.sep + "_" not in frame.f_code.co_filename:
            frame = frame.f_back
        if frame is not None:
            return
        time.sleep(0.005)
    raise AssertionError("the compile thread never ran torch's compiler")


def test_the_compile_starts_only_once_the_engine_has_had_no_request_for_a_while(tiny_model_dir, monkeypatch):
    # a compile takes a core and the GIL: begun with the engine, it slowed Engine() and its first requests 2-3x
    starts = []

    def compile_starts() -> None:
        starts.append(time.monotonic())
        raise RuntimeError("no compile in this test")

    monkeypatch.setattr(compiled_module, "use_our_inductor_cache", compile_starts)
    with Engine(str(tiny_model_dir), device="cpu", kv_cache_tokens=1024, compile_layers=True) as engine:
        engine.generate(PROMPTS, {**GREEDY, "max_new_tokens": 32})
        served = time.monotonic()
        assert engine.decode_compile.finished.wait(60) and engine.decode_compile.state == "failed"
        engine.check_invariants()
    assert len(starts) == 1 and starts[0] > served
