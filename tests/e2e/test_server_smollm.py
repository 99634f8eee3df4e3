"""The real SmolLM2 behind a live server: the HTTP answers are the engine's own greedy tokens."""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from radixlang.server.launch import background_server

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def smollm_url(smollm_engine):
    with background_server(smollm_engine) as server:
        yield server.url
    smollm_engine.check_invariants()


def test_chat_answers_like_the_in_process_engine(smollm_engine, smollm_url):
    prompt = smollm_engine.tokenizer.apply_chat_template(QUESTION)
    expected = smollm_engine.generate(prompt, {"temperature": 0, "max_new_tokens": 24})
    with openai.OpenAI(base_url=f"{smollm_url}/v1", api_key="unused", max_retries=0) as client:
        out = client.chat.completions.create(model="default", messages=QUESTION, max_tokens=24, temperature=0)
    assert out.choices[0].message.content == expected.text
    assert "Paris" in out.choices[0].message.content


def test_native_stream_of_real_text_ends_with_the_full_completion(smollm_engine, smollm_url):
    prompt = "The three primary colors are"
    expected = smollm_engine.generate(prompt, {"temperature": 0, "max_new_tokens": 20})
    text = ""
    with httpx.stream("POST", f"{smollm_url}/generate", timeout=120, json={
            "text": prompt, "stream": True, "sampling_params": {"temperature": 0, "max_new_tokens": 20}}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                text = json.loads(line[6:])["text"]
    assert text == expected.text and text.strip()
