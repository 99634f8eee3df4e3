"""The HTTP Endpoint backend, against the real server (server/), gives what the in-process backend
gives."""
from __future__ import annotations

import io

import pytest

import radixlang as rl

PREFIX = "Question: which city is the capital of France? The answer is "


@pytest.fixture
def endpoint(engine, server_url) -> rl.Endpoint:
    return rl.Endpoint(server_url)  # the chat template comes from GET /get_model_info


def recorded(endpoint: rl.Endpoint, monkeypatch) -> list[tuple[str, dict]]:
    """The (path, body) of every request the endpoint sends."""
    sent: list[tuple[str, dict]] = []
    original = endpoint._open
    monkeypatch.setattr(endpoint, "_open", lambda path, payload=None: (sent.append((path, payload)),
                                                                      original(path, payload))[1])
    return sent


@rl.function
def chat(s, question):
    s += rl.system("Be brief.")
    s += rl.user(question)
    s += rl.assistant(rl.gen("answer", max_tokens=10, temperature=0, return_logprob=True))
    s += "Topic:" + rl.gen("topic", max_tokens=4, temperature=0, stop="\n")


@rl.function
def pick(s, method):
    s += PREFIX + rl.select("city", ["Paris", "London", "Rome and Milan"], choices_method=method)


def test_endpoint_generates_like_the_engine_backend(backend, endpoint, monkeypatch):
    sent = recorded(endpoint, monkeypatch)
    remote = chat.run(question="Hi?", backend=endpoint)
    local = chat.run(question="Hi?", backend=backend)
    assert remote.error() is None
    assert remote.text() == local.text() and remote.messages() == local.messages()
    assert (remote["answer"], remote["topic"]) == (local["answer"], local["topic"])
    got, want = remote.get_meta_info("answer"), local.get_meta_info("answer")
    assert got["completion_tokens"] == want["completion_tokens"]
    assert got["finish_reason"] == want["finish_reason"]
    assert [e[1] for e in got["output_token_logprobs"]] == [e[1] for e in want["output_token_logprobs"]]
    streamed = [body for path, body in sent if path == "/generate" and body.get("stream")]
    assert len(streamed) == 2 and streamed[0]["sampling_params"] == {"max_new_tokens": 10, "temperature": 0}


def test_endpoint_streams_text_as_it_arrives(endpoint):
    @rl.function
    def long_answer(s):
        s += "Once upon a time" + rl.gen("story", max_tokens=64, temperature=0, ignore_eos=True)

    state = long_answer.run(backend=endpoint, stream=True)
    chunks = list(state.text_iter("story"))
    assert len(chunks) > 1 and "".join(chunks) == state["story"]


@pytest.mark.parametrize("method", [rl.token_length_normalized, rl.greedy_token_selection,
                                    rl.unconditional_likelihood_normalized])
def test_endpoint_select_matches_the_engine_backend(backend, endpoint, method):
    remote = pick.run(method, backend=endpoint)
    local = pick.run(method, backend=backend)
    assert remote["city"] == local["city"]
    got, want = remote.get_meta_info("city"), local.get_meta_info("city")
    assert [[e[1] for e in row] for row in got["input_token_logprobs"]] == \
        [[e[1] for e in row] for row in want["input_token_logprobs"]]
    assert got["normalized_prompt_logprobs"] == pytest.approx(want["normalized_prompt_logprobs"], abs=1e-4)
    if method is rl.unconditional_likelihood_normalized:
        assert got["normalized_unconditional_prompt_logprobs"] == pytest.approx(
            want["normalized_unconditional_prompt_logprobs"], abs=1e-4)


def test_endpoint_select_finds_healing_beyond_its_window(backend, endpoint, monkeypatch):
    monkeypatch.setattr(rl.lang.endpoint, "SELECT_HEAL_WINDOW", 1)
    prefix = "Pick a word: super"  # "market" rejoins " super" into " supermarket": before a 1-token window

    @rl.function
    def word(s):
        s += prefix + rl.select("w", ["man", "market"])

    sent = recorded(endpoint, monkeypatch)
    remote = word.run(backend=endpoint)
    local = word.run(backend=backend)
    assert remote["w"] == local["w"]
    assert [[e[1] for e in row] for row in remote.get_meta_info("w")["input_token_logprobs"]] == \
        [[e[1] for e in row] for row in local.get_meta_info("w")["input_token_logprobs"]]
    starts = [body["logprob_start_len"] for path, body in sent if body and "logprob_start_len" in body]
    assert starts == [4, 0]  # the window first, then the whole prompt


def test_remote_run_ships_the_program_and_rebuilds_its_state(backend, endpoint, monkeypatch):
    sent = recorded(endpoint, monkeypatch)
    remote = chat.run(question="Hi?", backend=endpoint, remote=True)
    local = chat.run(question="Hi?", backend=backend)
    assert remote.error() is None
    assert remote.text() == local.text() and remote.messages() == local.messages()
    assert remote["topic"] == local["topic"]
    assert remote.get_meta_info("answer")["completion_tokens"] == local.get_meta_info("answer")["completion_tokens"]
    programs = [(path, body) for path, body in sent if path == "/v1/programs"]
    (path, body), = programs  # the whole program in one request
    assert body["args"] == {} and body["program"]["params"] == []


def test_remote_run_streams_text_as_the_server_generates_it(backend, endpoint):
    remote = chat.run(question="Hi?", backend=endpoint, remote=True, stream=True)
    chunks = list(remote.text_iter())
    assert "".join(chunks) == chat.run(question="Hi?", backend=backend).text()


def test_remote_program_errors_come_back_clearly(endpoint):
    @rl.function
    def bad(s):
        s += "x" + rl.gen("y", top_k=10**9)

    state = bad.run(backend=endpoint, remote=True)
    assert state.error() is not None and "top_k must be in" in str(state.error())


def test_endpoint_cache_and_flush(endpoint, engine):
    endpoint.cache_prefix(PREFIX)
    assert engine.stats()["kv_cached_tokens"] == len(engine.tokenizer.encode(PREFIX))
    assert rl.flush_cache(endpoint) is True
    assert engine.stats()["kv_cached_tokens"] == 0


def test_endpoint_errors_are_clear(endpoint):
    @rl.function
    def bad(s):
        s += "x" + rl.gen("y", top_k=10**9)  # only the server knows the vocabulary size

    state = bad.run(backend=endpoint)
    assert isinstance(state.error(), ValueError) and "top_k must be in" in str(state.error())

    @rl.function
    def with_image(s):
        s += "x" + rl.image(b"img") + rl.gen("y", max_tokens=1)

    assert "names no image placeholder" in str(with_image.run(backend=endpoint).error())  # a text model
    state = chat.run(question="Hi?", backend=rl.Endpoint("http://127.0.0.1:9"))
    assert isinstance(state.error(), ConnectionError)
    with pytest.raises(ValueError, match="http"):
        rl.Endpoint("localhost:30000")


def test_roles_use_the_chat_template_the_server_reports(backend, server_url, engine):
    remote = chat.run(question="Hi?", backend=rl.Endpoint(server_url))
    assert remote.error() is None
    assert remote.text() == chat.run(question="Hi?", backend=backend).text()
    template = ("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
                "{% if add_generation_prompt %}[assistant]{% endif %}")
    given = chat.run(question="Hi?", backend=rl.Endpoint(server_url, chat_template=template))
    assert given.error() is None and given.text().startswith("[system]Be brief.[user]Hi?[assistant]")


def test_an_error_event_mid_stream_fails_the_gen(endpoint, monkeypatch):
    lines = [b'data: {"text": "par", "meta_info": {"finish_reason": null}}\n\n',
             b'data: {"error": {"message": "engine exploded", "type": "server_error", "code": 500}}\n\n',
             b"data: [DONE]\n\n"]
    monkeypatch.setattr(endpoint, "_open", lambda path, payload=None: io.BytesIO(b"".join(lines)))
    state = rl.function(lambda s: s.__iadd__("x" + rl.gen("y"))).run(backend=endpoint)
    assert isinstance(state.error(), RuntimeError) and "engine exploded" in str(state.error())


def _leaves(value, path=""):
    """(path, leaf) for every leaf of nested lists and dicts."""
    if isinstance(value, dict):
        return [leaf for k in sorted(value) for leaf in _leaves(value[k], f"{path}.{k}")]
    if isinstance(value, (list, tuple)):
        return [leaf for i, v in enumerate(value) for leaf in _leaves(v, f"{path}[{i}]")]
    return [(path, value)]


def test_gen_meta_info_is_the_same_in_process_and_through_the_server(backend, endpoint, engine):
    @rl.function
    def prog(s):
        s += "The cat sat on" + rl.gen("v", max_tokens=6, temperature=0, return_logprob=True, top_logprobs_num=2,
                                       return_text_in_logprobs=True)

    local = prog.run(backend=backend).get_meta_info("v")
    engine.flush_cache()  # the second run computes its prompt again, as the first did
    remote = prog.run(backend=endpoint).get_meta_info("v")
    sglang_keys = {"id", "finish_reason", "prompt_tokens", "cached_tokens", "completion_tokens", "e2e_latency",
                   "input_token_logprobs", "output_token_logprobs", "input_top_logprobs", "output_top_logprobs",
                   "output_token_logprobs_length", "weight_version"}
    assert set(local) == set(remote) == sglang_keys
    assert local["e2e_latency"] > 0 and remote["e2e_latency"] > 0 and local["id"] and remote["id"]
    got = _leaves({k: v for k, v in remote.items() if k not in ("id", "e2e_latency")})
    want = _leaves({k: v for k, v in local.items() if k not in ("id", "e2e_latency")})
    assert [p for p, _ in got] == [p for p, _ in want]
    for (path, g), (_, w) in zip(got, want):
        assert g == (pytest.approx(w, abs=1e-4) if isinstance(w, float) else w), path
    texts = [e[2] for e in local["output_token_logprobs"]]
    assert texts == [engine.tokenizer.decode([e[1]], skip_special_tokens=False) for e in local["output_token_logprobs"]]
    engine.check_invariants()
