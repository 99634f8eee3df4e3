"""Talk to a radixlang server: SGLang's native /generate and the OpenAI-compatible /v1 API.

    .venv/bin/python examples/server_client.py                       # serves SmolLM2 in-process first
    .venv/bin/python examples/server_client.py --url http://127.0.0.1:30000   # a `radixlang serve`
"""
from __future__ import annotations

import argparse
import contextlib
import json

import httpx
import openai  # pip install openai (in the `test` extra)


def native(url: str) -> None:
    # one request, the whole answer
    r = httpx.post(f"{url}/generate", timeout=120, json={
        "text": "The capital of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 12}})
    r.raise_for_status()
    print("generate:", repr(r.json()["text"]), r.json()["meta_info"]["finish_reason"])

    # streaming: each server-sent event carries the text so far
    body = {"text": "List three fruits:", "stream": True, "sampling_params": {"temperature": 0, "max_new_tokens": 24}}
    shown = 0
    print("stream:  ", end="")
    with httpx.stream("POST", f"{url}/generate", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                text = json.loads(line[len("data: "):])["text"]
                print(text[shown:], end="", flush=True)
                shown = len(text)
    print()


def openai_api(url: str) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    messages = [{"role": "user", "content": "What is the capital of Italy? Answer in one word."}]
    out = client.chat.completions.create(model="default", messages=messages, max_tokens=16, temperature=0)
    print("chat:    ", out.choices[0].message.content, out.usage)

    print("chat stream: ", end="")
    for chunk in client.chat.completions.create(model="default", messages=messages, max_tokens=16,
                                                temperature=0, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            print(chunk.choices[0].delta.content, end="", flush=True)
    print()

    scored = client.completions.create(model="default", prompt="Paris is in France", max_tokens=0, echo=True,
                                       logprobs=1)  # score a text: log-prob of each token given the ones before
    lp = scored.choices[0].logprobs
    print("scores:  ", list(zip(lp.tokens, lp.token_logprobs)))


def metrics(url: str) -> None:
    lines = httpx.get(f"{url}/metrics").text.splitlines()
    print("metrics: ", [line for line in lines if line.startswith("radixlang_generation_tokens")])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", help="a running server; default: start one in this process")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        url = args.url
        if url is None:
            from radixlang.runtime.engine import Engine
            from radixlang.server.launch import background_server

            engine = stack.enter_context(Engine())
            url = stack.enter_context(background_server(engine)).url
        native(url)
        openai_api(url)
        metrics(url)


if __name__ == "__main__":
    main()
