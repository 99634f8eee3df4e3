"""run (streaming, async iteration, errors) and run_batch (order, prefix pre-caching, threads)."""
from __future__ import annotations

import asyncio
import re

import pytest

import radixlang as rl

SYSTEM = "You are a careful assistant who answers questions about geography in one short sentence."


@rl.function
def ask(s, question):
    s += rl.system(SYSTEM)
    s += rl.user(question)
    s += rl.assistant(rl.gen("answer", max_tokens=12, temperature=0, ignore_eos=True))


@rl.function
def long_answer(s):
    s += rl.user("Tell me about Peru.")
    s += rl.assistant(rl.gen("answer", max_tokens=64, temperature=0, ignore_eos=True))


def test_streaming_yields_the_text_as_it_is_generated(backend):
    state = long_answer.run(stream=True, backend=backend)
    chunks = list(state.text_iter("answer"))
    assert len(chunks) > 1
    assert "".join(chunks) == state["answer"]
    state = ask.run(question="Where is Peru?", stream=True, backend=backend)
    chunks = list(state.text_iter("answer"))
    assert "".join(chunks) == state["answer"]
    whole = ask.run(question="Where is Peru?", stream=True, backend=backend)
    assert "".join(whole.text_iter()) == whole.text() == state.text()


def test_text_iter_waits_for_a_variable_the_program_has_not_reached(backend):
    @rl.function
    def slow_start(s):
        s += "Warm up:" + rl.gen("warm", max_tokens=6, temperature=0)
        s += " Then:" + rl.gen("late", max_tokens=6, temperature=0)

    state = slow_start.run(stream=True, backend=backend)
    assert "".join(state.text_iter("late")) == state["late"] and state["late"]


def test_async_iteration(backend):
    async def collect():
        state = ask.run(question="Where is Chad?", stream=True, backend=backend)
        pieces = [chunk async for chunk in state.text_async_iter("answer")]
        with_meta = ask.run(question="Where is Chad?", stream=True, backend=backend)
        metas = [meta async for _, meta in with_meta.text_async_iter("answer", return_meta_data=True)]
        whole = ask.run(question="Where is Chad?", stream=True, backend=backend)
        text = "".join([chunk async for chunk in whole])
        return state, pieces, metas, whole, text

    state, pieces, metas, whole, text = asyncio.run(collect())
    assert "".join(pieces) == state["answer"]
    assert text == whole.text()
    assert metas[-1]["completion_tokens"] == 12


def test_streamed_program_errors_are_raised_after_the_text(backend):
    @rl.function
    def fails_late(s):
        s += "Start:" + rl.gen("a", max_tokens=3, temperature=0)
        raise RuntimeError("tool failed")

    state = fails_late.run(stream=True, backend=backend)
    with pytest.raises(RuntimeError, match="tool failed"):
        list(state.text_iter())
    assert isinstance(state.error(), RuntimeError)
    with pytest.raises(RuntimeError, match="tool failed"):
        state.sync()


QUESTIONS = ["Where is Peru?", "Where is Chad?", "Where is Laos?", "Where is Fiji?"]


def test_run_batch_matches_single_runs_in_order(backend):
    states = ask.run_batch([{"question": q} for q in QUESTIONS], backend=backend, num_threads=3)
    singles = [ask.run(question=q, backend=backend)["answer"] for q in QUESTIONS]
    assert [s["answer"] for s in states] == singles
    positional = ask.run_batch([(q,) for q in QUESTIONS[:2]], backend=backend, num_threads=1)
    assert [s["answer"] for s in positional] == singles[:2]


def test_run_batch_caches_the_shared_constant_prefix_once(backend, engine, monkeypatch):
    cached = []
    original = backend.cache_prefix
    monkeypatch.setattr(backend, "cache_prefix", lambda text: (cached.append(text), original(text)))
    states = ask.run_batch([{"question": q} for q in QUESTIONS], backend=backend)
    template = engine.tokenizer.apply_chat_template
    system_only = template([{"role": "system", "content": SYSTEM}], add_generation_prompt=False)
    assert cached == [system_only + "<|im_start|>user\n"]  # up to the first argument
    prefix_tokens = len(engine.tokenizer.encode(cached[0]))
    assert all(s.get_meta_info("answer")["cached_tokens"] >= prefix_tokens for s in states)


def test_run_batch_reports_progress_and_isolates_failures(backend, capsys):
    @rl.function
    def maybe(s, fail):
        s += "Value:"
        if fail:
            raise ValueError("bad item")
        s += rl.gen("v", max_tokens=2, temperature=0)

    states = maybe.run_batch([{"fail": False}, {"fail": True}, {"fail": False}], backend=backend,
                             progress_bar=True)
    assert [s.error() is None for s in states] == [True, False, True]
    err = capsys.readouterr().err
    draws = [d for d in err.replace("\n", "\r").split("\r") if d.strip()]  # tqdm redraws its line with \r
    counts = [int(m.group(1)) for d in draws if (m := re.search(r"\| (\d+)/3 \[", d))]
    assert all(d.startswith("run_batch: ") for d in draws)
    assert counts[0] == 0 and counts[-1] == 3 and counts == sorted(counts)  # 0 to 3, never backwards
    assert "100%" in draws[-1] and err.endswith("\n")  # tqdm closed the bar


def test_run_batch_without_progress_bar_writes_nothing_to_stderr(backend, capsys):
    states = ask.run_batch([{"question": q} for q in QUESTIONS[:2]], backend=backend)
    assert all(s.error() is None for s in states)
    assert capsys.readouterr().err == ""


def test_run_batch_validates_its_input(backend):
    with pytest.raises(ValueError, match="num_threads"):
        ask.run_batch([{"question": "x"}], backend=backend, num_threads=0)
    with pytest.raises(TypeError, match="must be a dict or a tuple"):
        ask.run_batch(["x"], backend=backend)
    with pytest.raises(TypeError):
        ask.run_batch([{"wrong": "x"}], backend=backend)
    assert ask.run_batch([], backend=backend) == []


def test_default_backend(backend, monkeypatch):
    monkeypatch.setattr(rl.global_config, "default_backend", None)
    rl.set_default_backend(backend.engine)  # an Engine is wrapped
    assert ask.run(question="Where is Peru?")["answer"]
    with pytest.raises(TypeError, match="backend must be"):
        rl.set_default_backend(object())
    assert rl.flush_cache() is True


def test_get_server_info_reads_the_given_backend_or_the_default(backend, monkeypatch):
    monkeypatch.setattr(rl.global_config, "default_backend", None)
    given = rl.get_server_info(backend)  # mypy found this path importing as_backend from the wrong module
    assert given["model"] == backend.engine.config.model and "running_requests" in given["internal_states"][0]
    rl.set_default_backend(backend)
    assert rl.get_server_info()["model"] == backend.engine.config.model
