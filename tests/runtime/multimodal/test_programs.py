"""Several images per prompt everywhere: lang programs (in process and through /v1/programs), /generate's
image_data and OpenAI image_url parts, each checked against the engine called directly."""
from __future__ import annotations

import base64
import io

import pytest

import radixlang as rl

from ...server.conftest import serving
from .llava_tiny import GREEDY, noise_image

A, B = noise_image(51), noise_image(52, (40, 90))
QUESTION = "USER: <image> vs <image> and <image>\nSame? ASSISTANT:"


def data_url(image) -> str:
    out = io.BytesIO()
    image.save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


@rl.function
def compare(s, first, second):
    s += "USER: " + rl.image(first) + " vs " + rl.image(second) + " and " + rl.image(first)
    s += "\nSame? ASSISTANT:" + rl.gen("answer", max_tokens=6)
    s += "\nUSER: Sure? ASSISTANT:" + rl.select("sure", [" yes", " no", " maybe"])


def test_a_program_with_three_images_matches_the_engine_and_encodes_each_image_once(engine):
    before = engine.image_encoder.counters.encodes
    state = compare.run(first=A, second=B, backend=engine, temperature=0)
    direct = engine.generate(QUESTION, GREEDY, image_data=[A, B, A])
    assert state["answer"] == direct.text
    assert engine.image_encoder.counters.encodes == before + 2  # A's second span comes from the cache
    # select scores each choice after the whole prefix, images included
    prefix = QUESTION + direct.text + "\nUSER: Sure? ASSISTANT:"
    scores = [engine.generate(prefix + c, {"max_new_tokens": 0}, image_data=[A, B, A], return_logprob=True,
                              logprob_start_len=len(engine.tokenizer.encode(prefix))).meta.input_logprobs
              for c in (" yes", " no", " maybe")]
    best = max(range(3), key=lambda i: sum(lp.logprob for lp in scores[i]) / len(scores[i]))
    assert state["sure"] == [" yes", " no", " maybe"][best]
    engine.check_invariants()


def test_forks_share_the_image_prefix(engine):
    @rl.function
    def fan_out(s, picture):
        s += "USER: " + rl.image(picture) + "\nDescribe. ASSISTANT:"
        forks = s.fork(3)
        forks += lambda i: f" ({i})" + rl.gen("part", max_tokens=3)
        forks.join()

    before = engine.image_encoder.counters.encodes
    fan_out.run(picture=noise_image(53), backend=engine, temperature=0)
    assert engine.image_encoder.counters.encodes == before + 1
    engine.check_invariants()


@pytest.fixture(scope="module")
def llava_server(clip_llava):
    with serving(clip_llava[0]) as live:
        yield live


def test_generate_takes_image_data_as_data_urls(llava_server):
    engine = llava_server.engine
    body = {"text": QUESTION, "image_data": [data_url(A), data_url(B), data_url(A)], "sampling_params": GREEDY}
    with llava_server.client() as http:
        r = http.post("/generate", json=body)
        batch = http.post("/generate", json=body | {"text": [QUESTION, "USER: <image>\nAnd? ASSISTANT:"],
                                                    "image_data": [body["image_data"], [data_url(B)]]})
    assert r.status_code == 200 and batch.status_code == 200, (r.text, batch.text)
    assert r.json()["text"] == engine.generate(QUESTION, GREEDY, image_data=[A, B, A]).text
    assert batch.json()[0]["text"] == r.json()["text"]
    assert batch.json()[0]["meta_info"]["cached_tokens"] == batch.json()[0]["meta_info"]["prompt_tokens"] - 1
    llava_server.wait_idle()


def test_chat_completions_take_image_url_parts(llava_server):
    engine = llava_server.engine
    content = [{"type": "image_url", "image_url": {"url": data_url(A)}}, {"type": "text", "text": "and"},
               {"type": "image_url", "image_url": {"url": data_url(B), "detail": "low"}}]
    body = {"model": engine.model_name, "messages": [{"role": "user", "content": content}], "max_tokens": 6,
            "temperature": 0}
    with llava_server.client() as http:
        r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    direct = engine.generate("USER: <image>\nand\n<image>\nASSISTANT:", GREEDY, image_data=[A, B])
    assert r.json()["choices"][0]["message"]["content"] == direct.text
    llava_server.wait_idle()


def test_programs_route_runs_images_in_the_ir(llava_server):
    engine = llava_server.engine

    @rl.function
    def fixed(s):
        s += "USER: " + rl.image(A) + " vs " + rl.image(B) + " and " + rl.image(A)
        s += "\nSame? ASSISTANT:" + rl.gen("answer", max_tokens=6)

    body = {"program": fixed.trace().to_dict(), "sampling_params": {"temperature": 0}}
    with_args = {"program": compare.trace().to_dict(), "args": {"first": data_url(A), "second": data_url(B)},
                 "sampling_params": {"temperature": 0}}
    with llava_server.client() as http:
        r = http.post("/v1/programs", json=body)
        from_args = http.post("/v1/programs", json=with_args)
        a_path = http.post("/v1/programs", json=with_args | {"args": {"first": "/etc/hosts", "second": "x"}})
    assert r.status_code == 200 and from_args.status_code == 200, (r.text, from_args.text)
    assert r.json()["vars"]["answer"] == engine.generate(QUESTION, GREEDY, image_data=[A, B, A]).text
    assert from_args.json()["vars"]["answer"] == r.json()["vars"]["answer"]
    assert a_path.status_code == 400 and "base64" in a_path.json()["error"]["message"]
    llava_server.wait_idle()


def test_the_endpoint_client_sends_images_like_the_engine_backend(llava_server, engine):
    """A program run through rl.Endpoint (one /generate per gen / select, images as data URLs) gives what
    it gives in process; the server's engine and the in-process one load the same folder."""
    endpoint = rl.Endpoint(llava_server.url)
    assert endpoint.model_info()["image_token"] == engine.image_prompts.placeholder
    pixels = A.convert("L")  # a PIL image travels as raw pixels, then as a PNG
    remote = compare.run(first=pixels, second=B, backend=endpoint, temperature=0)
    local = compare.run(first=pixels, second=B, backend=engine, temperature=0)
    assert remote.error() is None, remote.error()
    assert (remote["answer"], remote["sure"]) == (local["answer"], local["sure"])
    encoded = compare.run(first=base64.b64decode(data_url(A).split(",")[1]), second=B, backend=endpoint,
                          temperature=0)
    assert encoded["answer"] == compare.run(first=A, second=B, backend=engine, temperature=0)["answer"]
    llava_server.wait_idle()
    engine.check_invariants()


@pytest.mark.parametrize("body,param,message", [
    ({"text": QUESTION, "image_data": ["data:image/png;base64,AAAA"] * 3}, "image_data[0]", "not an image"),
    ({"text": QUESTION, "image_data": ["/etc/hosts"] * 3}, "image_data[0]", "base64"),
    ({"text": QUESTION, "image_data": [data_url(A)]}, None, "3 image placeholder"),
])
def test_bad_image_data_is_a_400_and_the_server_stays_healthy(llava_server, body, param, message):
    with llava_server.client() as http:
        r = http.post("/generate", json=body | {"sampling_params": GREEDY})
        assert r.status_code == 400, r.text
        assert message in r.json()["error"]["message"]
        if param is not None:
            assert r.json()["error"]["param"] == param
        ok = http.post("/generate", json={"text": "USER: hi ASSISTANT:", "sampling_params": GREEDY})
    assert ok.status_code == 200
    llava_server.wait_idle()


def test_a_text_model_server_refuses_image_data(tiny_model_dir):
    with serving(tiny_model_dir) as live, live.client() as http:
        r = http.post("/generate", json={"text": "hi", "image_data": [data_url(A)], "sampling_params": GREEDY})
        assert r.status_code == 400 and "no vision tower" in r.json()["error"]["message"]
        live.wait_idle()
