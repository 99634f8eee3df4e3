"""fork / join: shared prefix KV, parallel children, gathering and concatenation."""
from __future__ import annotations

import pytest

import radixlang as rl

PREFIX = "Here are some different ideas for a weekend trip, each on its own line:\n"


def test_forked_children_reuse_the_prefix_computed_once(backend, engine):
    prefix_tokens = len(engine.tokenizer.encode(PREFIX))
    before = engine.stats()

    @rl.function
    def ideas(s):
        s += PREFIX
        forks = s.fork(3)
        for i, f in enumerate(forks):
            f += f"Idea {i + 1}:" + rl.gen("idea", max_tokens=4, temperature=0, ignore_eos=True)
        forks.join()

    state = ideas.run(backend=backend)
    metas = state.get_meta_info("idea")
    # every child found the whole prefix cached (a later child may also reuse an earlier one's "Idea")
    assert all(m["cached_tokens"] >= prefix_tokens for m in metas)
    after = engine.stats()
    computed = (after["prompt_tokens_total"] - before["prompt_tokens_total"]) - \
        (after["cached_tokens_total"] - before["cached_tokens_total"])
    suffixes = sum(m["prompt_tokens"] - prefix_tokens for m in metas)
    assert computed <= prefix_tokens + suffixes  # the prefix once (the pre-caching request), then suffixes


def test_forked_children_decode_in_parallel(backend, engine):
    tokens = 8
    before = engine.stats()["steps_total"]

    @rl.function
    def ideas(s):
        s += PREFIX
        forks = s.fork(3)
        forks += lambda i: f"Idea {i}:" + rl.gen("idea", max_tokens=tokens, temperature=0, ignore_eos=True)
        forks.join()

    state = ideas.run(backend=backend)
    assert [m["completion_tokens"] for m in state.get_meta_info("idea")] == [tokens] * 3
    steps = engine.stats()["steps_total"] - before
    assert steps < 3 * tokens  # one after another takes at least 3 * tokens steps (a token per child per step)


def test_join_gathers_variables_and_concatenates_text(backend, oracle_engine):
    @rl.function
    def gather(s):
        s += PREFIX
        forks = s.fork(2)
        forks += [" A:" + rl.gen("x", max_tokens=3, temperature=0), " B:" + rl.gen("x", max_tokens=3, temperature=0)]
        forks[1] += rl.gen("y", max_tokens=2, temperature=0)
        forks.join()
        s += "|"
        more = s.fork(2)
        more += lambda i: f"#{i}"
        more.join("concate_and_append")

    state = gather.run(backend=backend)
    first = oracle_engine.generate(PREFIX + " A:", {"max_new_tokens": 3, "temperature": 0}).text
    second = oracle_engine.generate(PREFIX + " B:", {"max_new_tokens": 3, "temperature": 0}).text
    third = oracle_engine.generate(PREFIX + " B:" + second, {"max_new_tokens": 2, "temperature": 0}).text
    assert state["x"] == [first, second]
    assert state["y"] == [third]
    assert state.text() == PREFIX + "|#0#1"


def test_nested_forks_and_sibling_references(backend):
    @rl.function
    def nested(s):
        s += PREFIX
        outer = s.fork(2)
        outer[0] += "One:" + rl.gen("a", max_tokens=2, temperature=0)
        outer[1] += "Two, after " + outer[0]["a"] + ":"
        inner = outer[1].fork(2)
        inner += lambda i: rl.gen("b", max_tokens=2, temperature=0)
        inner.join()
        outer.join()
        with s.copy() as c:
            c += "Copy:" + rl.gen("c", max_tokens=2, temperature=0)

    state = nested.run(backend=backend)
    assert state.error() is None
    assert len(state["a"]) == 1 and len(state["b"]) == 1 and len(state["b"][0]) == 2
    assert len(state["c"]) == 1
    assert state.text() == PREFIX


def test_a_childs_error_is_raised_by_join(backend):
    @rl.function
    def failing(s):
        s += PREFIX
        forks = s.fork(2)
        forks[1] += rl.image(b"not for a text model") + rl.gen("x", max_tokens=2)
        forks.join()
        s += "unreachable"

    state = failing.run(backend=backend)
    with pytest.raises(ValueError, match="does not support images"):
        state.sync()
    assert "unreachable" not in state._core.text


def test_fork_validates_its_size_and_list_appends(backend):
    for size in (0, -1, "2", 10**6):
        state = rl.function(lambda s, n=size: s.fork(n)).run(backend=backend)
        assert isinstance(state.error(), ValueError) and "fork size" in str(state.error())

    @rl.function
    def mismatched(s):
        s += PREFIX
        s.fork(2).__iadd__(["only one"])

    assert "needs 2 items" in str(mismatched.run(backend=backend).error())
