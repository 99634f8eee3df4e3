"""The HTTP Endpoint backend gives what the in-process backend gives, through the /generate contract."""
from __future__ import annotations

import pytest

import radixlang as rl

PREFIX = "Question: which city is the capital of France? The answer is "


@rl.function
def chat(s, question):
    s += rl.system("Be brief.")
    s += rl.user(question)
    s += rl.assistant(rl.gen("answer", max_tokens=10, temperature=0, return_logprob=True))
    s += "Topic:" + rl.gen("topic", max_tokens=4, temperature=0, stop="\n")


@rl.function
def pick(s, method):
    s += PREFIX + rl.select("city", ["Paris", "London", "Rome and Milan"], choices_method=method)


def test_endpoint_generates_like_the_engine_backend(backend, contract_server):
    endpoint = rl.Endpoint(contract_server.url)
    remote = chat.run(question="Hi?", backend=endpoint)
    local = chat.run(question="Hi?", backend=backend)
    assert remote.error() is None
    assert remote.text() == local.text() and remote.messages() == local.messages()
    assert (remote["answer"], remote["topic"]) == (local["answer"], local["topic"])
    meta = remote.get_meta_info("answer")
    assert meta["completion_tokens"] == local.get_meta_info("answer")["completion_tokens"]
    streamed = [body for path, body in contract_server.requests if path == "/generate" and body.get("stream")]
    assert len(streamed) == 2 and streamed[0]["sampling_params"] == {"max_new_tokens": 10, "temperature": 0}


def test_endpoint_streams_text_as_it_arrives(contract_server):
    @rl.function
    def long_answer(s):
        s += "Once upon a time" + rl.gen("story", max_tokens=64, temperature=0, ignore_eos=True)

    state = long_answer.run(backend=rl.RuntimeEndpoint(contract_server.url), stream=True)
    chunks = list(state.text_iter("story"))
    assert len(chunks) > 1 and "".join(chunks) == state["story"]


@pytest.mark.parametrize("method", [rl.token_length_normalized, rl.greedy_token_selection,
                                    rl.unconditional_likelihood_normalized])
def test_endpoint_select_matches_the_engine_backend(backend, contract_server, method):
    remote = pick.run(method, backend=rl.Endpoint(contract_server.url))
    local = pick.run(method, backend=backend)
    assert remote["city"] == local["city"]
    got, want = remote.get_meta_info("city"), local.get_meta_info("city")
    assert [[e[1] for e in row] for row in got["input_token_logprobs"]] == \
        [[e[1] for e in row] for row in want["input_token_logprobs"]]
    assert got["normalized_prompt_logprobs"] == pytest.approx(want["normalized_prompt_logprobs"], abs=1e-4)
    if method is rl.unconditional_likelihood_normalized:
        assert got["normalized_unconditional_prompt_logprobs"] == pytest.approx(
            want["normalized_unconditional_prompt_logprobs"], abs=1e-4)


def test_endpoint_select_finds_healing_beyond_its_window(backend, contract_server, monkeypatch):
    monkeypatch.setattr(rl.lang.endpoint, "SELECT_HEAL_WINDOW", 1)
    prefix = "Pick a word: super"  # the choices rejoin "super" into one token, further back than one token

    @rl.function
    def word(s):
        s += prefix + rl.select("w", ["man", "market"])

    remote = word.run(backend=rl.Endpoint(contract_server.url))
    local = word.run(backend=backend)
    assert remote["w"] == local["w"]
    assert remote.get_meta_info("w")["input_token_logprobs"][0][0][1] == \
        local.get_meta_info("w")["input_token_logprobs"][0][0][1]


def test_remote_run_ships_the_program_and_rebuilds_its_state(backend, contract_server):
    remote = chat.run(question="Hi?", backend=rl.Endpoint(contract_server.url), remote=True)
    local = chat.run(question="Hi?", backend=backend)
    assert remote.text() == local.text() and remote.messages() == local.messages()
    assert remote["topic"] == local["topic"]
    assert remote.get_meta_info("answer")["completion_tokens"] == local.get_meta_info("answer")["completion_tokens"]
    (program,) = [body for path, body in contract_server.requests if path == "/v1/programs"]
    assert program["args"] == {} and program["program"]["params"] == []


def test_endpoint_cache_and_flush(contract_server, engine):
    endpoint = rl.Endpoint(contract_server.url)
    endpoint.cache_prefix(PREFIX)
    assert engine.stats()["kv_cached_tokens"] == len(engine.tokenizer.encode(PREFIX))
    assert rl.flush_cache(endpoint) is True
    assert engine.stats()["kv_cached_tokens"] == 0


def test_endpoint_errors_are_clear(contract_server):
    @rl.function
    def bad(s):
        s += "x" + rl.gen("y", top_k=10**9)  # only the server knows the vocabulary size

    state = bad.run(backend=rl.Endpoint(contract_server.url))
    assert isinstance(state.error(), ValueError) and "top_k must be in" in str(state.error())

    @rl.function
    def with_image(s):
        s += "x" + rl.image(b"img") + rl.gen("y", max_tokens=1)

    assert "no image field" in str(with_image.run(backend=rl.Endpoint(contract_server.url)).error())

    closed = rl.Endpoint("http://127.0.0.1:9")
    state = chat.run(question="Hi?", backend=closed)
    assert isinstance(state.error(), ConnectionError)
    with pytest.raises(ValueError, match="http"):
        rl.Endpoint("localhost:30000")


def test_roles_need_a_chat_template_from_the_server_or_the_caller(backend, contract_server, engine):
    contract_server.model_info = False
    state = chat.run(question="Hi?", backend=rl.Endpoint(contract_server.url))
    assert isinstance(state.error(), ValueError) and "chat_template=" in str(state.error())
    given = rl.Endpoint(contract_server.url, chat_template=engine.tokenizer.chat_template)
    assert chat.run(question="Hi?", backend=given).text() == chat.run(question="Hi?", backend=backend).text()
