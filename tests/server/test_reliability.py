"""Many clients at once, clients that leave, and shutting down with requests in flight."""
from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest

from radixlang.runtime.engine import Engine
from radixlang.server.launch import background_server

from ..conftest import OUTLASTS_GRACE_KV_TOKENS, OUTLASTS_GRACE_TOKENS

MAX_NEW = 24
LONG = {"max_new_tokens": 900, "ignore_eos": True}


async def _one_client(i: int, prompt: str, http: httpx.AsyncClient, oai: openai.AsyncOpenAI) -> str:
    """Client i uses one of four ways in: native or OpenAI, streaming or not."""
    params = {"temperature": 0, "max_new_tokens": MAX_NEW}
    kind = i % 4
    if kind == 0:
        r = await http.post("/generate", json={"text": prompt, "sampling_params": params})
        r.raise_for_status()
        return r.json()["text"]
    if kind == 1:
        text = ""
        async with http.stream("POST", "/generate", json={"text": prompt, "sampling_params": params,
                                                          "stream": True}) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    text = json.loads(line[6:])["text"]  # cumulative
        return text
    if kind == 2:
        out = await oai.completions.create(model="default", prompt=prompt, max_tokens=MAX_NEW, temperature=0)
        return out.choices[0].text
    stream = await oai.completions.create(model="default", prompt=prompt, max_tokens=MAX_NEW, temperature=0,
                                          stream=True)
    return "".join([c.choices[0].text async for c in stream if c.choices])


def test_64_concurrent_clients_all_get_their_own_complete_answer(server_factory):
    server = server_factory(max_running_requests=4)  # most of them have to wait their turn
    prompts = [f"Client {i} asks about topic {i * 7 % 13}" for i in range(64)]
    expected = [c.text for c in server.engine.generate(prompts, {"temperature": 0, "max_new_tokens": MAX_NEW})]
    before = server.engine.stats()
    max_waiting = 0

    async def watch(done: asyncio.Event) -> None:
        nonlocal max_waiting
        while not done.is_set():
            stats = await asyncio.to_thread(server.engine.stats)
            max_waiting = max(max_waiting, stats["waiting_requests"])
            await asyncio.sleep(0.005)

    async def main() -> list[str]:
        limits = httpx.Limits(max_connections=128, max_keepalive_connections=128)
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as http, \
                openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0,
                                   timeout=120) as oai:
            done = asyncio.Event()
            watcher = asyncio.create_task(watch(done))
            results = await asyncio.gather(*(_one_client(i, p, http, oai) for i, p in enumerate(prompts)))
            done.set()
            await watcher
            return results

    results = asyncio.run(main())
    assert results == expected  # none lost, none mixed up with another client's
    after = server.wait_idle()
    assert after["finished_requests_total"] - before["finished_requests_total"] == 64
    assert after["aborted_requests_total"] == before["aborted_requests_total"]
    assert max_waiting > 0


def test_64_clients_half_of_which_hang_up_mid_stream_leak_nothing(server_factory):
    server = server_factory(max_running_requests=16)
    before = server.engine.stats()

    async def leave_early(http: httpx.AsyncClient, i: int) -> None:
        async with http.stream("POST", "/generate", json={"text": f"leaver {i}", "sampling_params": LONG,
                                                          "stream": True}) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    return  # closing the response drops the connection

    async def stay(http: httpx.AsyncClient, i: int) -> None:
        r = await http.post("/generate", json={"text": f"stayer {i}", "sampling_params": {"max_new_tokens": 8}})
        assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 8

    async def main() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=120,
                                     limits=httpx.Limits(max_connections=128)) as http:
            await asyncio.gather(*(leave_early(http, i) if i % 2 else stay(http, i) for i in range(64)))

    asyncio.run(main())
    after = server.wait_idle()  # every leaver aborted, every slot back in the tree or free
    assert after["aborted_requests_total"] - before["aborted_requests_total"] == 32
    assert after["finished_requests_total"] - before["finished_requests_total"] == 32


def test_shutdown_lets_short_requests_finish_and_aborts_the_rest_after_the_grace_period(long_tiny_model_dir,
                                                                                       stream_in_thread):
    engine = Engine(model=str(long_tiny_model_dir), kv_cache_tokens=OUTLASTS_GRACE_KV_TOKENS, device="cpu")
    try:
        with background_server(engine, grace_s=1.0) as srv:
            short_reader, short = stream_in_thread(srv.url, {"text": "short", "sampling_params": {
                "max_new_tokens": 40, "ignore_eos": True}})
            long_reader, long_ = stream_in_thread(srv.url, {"text": "long", "sampling_params": {
                "max_new_tokens": OUTLASTS_GRACE_TOKENS, "ignore_eos": True}})
            began = time.monotonic()
            srv.should_exit = True  # what SIGINT / SIGTERM do
            short_reader.join(30)
            long_reader.join(30)
            took = time.monotonic() - began
        for lines in (short, long_):
            assert lines[-1] == "data: [DONE]"
        assert json.loads(short[-2][6:])["meta_info"]["finish_reason"] == {"type": "length", "length": 40}
        assert json.loads(long_[-2][6:])["meta_info"]["finish_reason"]["type"] == "abort"
        assert took < 10
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{srv.url}/health")
        engine.check_invariants()
    finally:
        engine.shutdown()


def test_a_draining_server_answers_503(server):
    server.server.state.draining = True
    try:
        with server.client() as http:
            generate = http.post("/generate", json={"text": "x"})
            chat = http.post("/v1/chat/completions", json={"model": "default", "messages": [
                {"role": "user", "content": "x"}]})
            health = http.get("/health")
    finally:
        server.server.state.draining = False
    assert generate.status_code == chat.status_code == health.status_code == 503
    assert "shutting down" in generate.json()["error"]["message"]
