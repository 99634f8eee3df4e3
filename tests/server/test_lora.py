"""LoRA adapters over HTTP, driven by the `openai` SDK and SGLang's native routes; PEFT + transformers is the oracle
of the tokens (tests/lora_peft.py): `model="NAME"` (vLLM's convention) and `"BASE:NAME"` (SGLang's) on
/v1/completions, /generate's `lora_path` (one per prompt too), /v1/models listing the adapters with their parent,
/load_lora_adapter and /unload_lora_adapter, a 404 naming an unknown adapter, no KV shared across adapters; and
programs naming adapters in gen(lora=) and run(lora=), in process, over HTTP and shipped as IR (remote=True)."""
from __future__ import annotations

import openai
import pytest

import radixlang as rl
from tests.lora_peft import peft_greedy
from tests.server.conftest import serving

PROMPT = [1, 504, 2231, 30, 9, 712, 88, 4000, 19]
NEW = 8


@pytest.fixture(scope="module")
def server(tiny_model_dir, lora_adapters):
    # max_lora_rank 8: a1 (rank 8) loads later beside a0 (rank 4), which alone would size the slots
    with serving(tiny_model_dir, quantization="none", lora_paths=[f"a0={lora_adapters['a0']}"],
                 max_lora_rank=8) as live:
        yield live


@pytest.fixture(scope="module")
def peft_tokens(tiny_model_dir, lora_adapters):
    return {name: peft_greedy(tiny_model_dir, None if name is None else lora_adapters[name], [PROMPT], NEW)[0]
            for name in (None, "a0", "a1")}


@pytest.fixture
def client(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def complete(client, model: str):
    out = client.completions.create(model=model, prompt=PROMPT, max_tokens=NEW, temperature=0,
                                    extra_body={"ignore_eos": True})
    return out.choices[0].text, out.usage.prompt_tokens_details


def test_openai_model_names_an_adapter_and_equals_peft(server, client, peft_tokens):
    decode = server.engine.tokenizer.decode
    base = server.engine.model_name
    assert complete(client, "a0")[0] == decode(peft_tokens["a0"])
    assert complete(client, f"{base}:a0")[0] == decode(peft_tokens["a0"])  # SGLang's BASE:NAME
    assert complete(client, base)[0] == decode(peft_tokens[None])
    server.wait_idle()


def test_models_lists_adapters_with_their_parent(server, client, lora_adapters):
    models = {m.id: m for m in client.models.list().data}
    base = server.engine.model_name
    assert set(models) == {base, "a0"}
    assert models["a0"].parent == base and models[base].parent is None
    assert models["a0"].root == str(lora_adapters["a0"])


def test_an_unknown_adapter_is_a_404_naming_it(server, client):
    with pytest.raises(openai.NotFoundError) as e:
        complete(client, f"{server.engine.model_name}:nope")
    assert "'nope'" in e.value.message and e.value.param == "model"
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert "'nope'" in e.value.message and "a0" in e.value.message  # the served names
    with server.client() as http:
        r = http.post("/generate", json={"input_ids": PROMPT, "lora_path": "nope"})
        assert r.status_code == 404 and r.json()["error"]["param"] == "lora_path" and "'nope'" in r.text
    server.wait_idle()


def test_load_generate_per_prompt_and_unload_over_http(server, lora_adapters, peft_tokens):
    with server.client() as http:
        r = http.post("/load_lora_adapter", json={"lora_name": "a1", "lora_path": str(lora_adapters["a1"])})
        assert r.status_code == 200 and r.json()["loaded_adapters"] == {
            "a0": str(lora_adapters["a0"]), "a1": str(lora_adapters["a1"])}
        # one batch: a prompt per adapter and the base, each with its own lora_path
        r = http.post("/generate", json={"input_ids": [PROMPT] * 3, "lora_path": ["a1", None, "a0"],
                                         "sampling_params": {"temperature": 0, "max_new_tokens": NEW,
                                                             "ignore_eos": True}})
        assert r.status_code == 200, r.text
        assert [o["output_ids"] for o in r.json()] == [peft_tokens["a1"], peft_tokens[None], peft_tokens["a0"]]
        bad = http.post("/load_lora_adapter", json={"lora_name": "x", "lora_path": "/no/such/folder"})
        assert bad.status_code == 400 and "adapter_config.json" in bad.text
        assert http.post("/unload_lora_adapter", json={"lora_name": "a1"}).json()["loaded_adapters"] == {
            "a0": str(lora_adapters["a0"])}
        assert http.post("/unload_lora_adapter", json={"lora_name": "a1"}).status_code == 404
    server.wait_idle()


def test_kv_is_never_shared_across_adapters(server, client):
    server.engine.flush_cache()
    complete(client, "a0")
    assert complete(client, "a0")[1].cached_tokens == len(PROMPT) - 1  # within an adapter: reused
    assert complete(client, server.engine.model_name)[1].cached_tokens == 0  # the base: its own
    server.engine.flush_cache()
    complete(client, server.engine.model_name)
    assert complete(client, "a0")[1].cached_tokens == 0  # an adapter never reads the base's KV
    server.wait_idle()


@rl.function
def tip(s):
    s += "Here is a tip:"
    s += rl.gen("a", max_tokens=NEW, temperature=0, ignore_eos=True, lora="a0")  # this gen runs the adapter
    s += rl.gen("b", max_tokens=NEW, temperature=0, ignore_eos=True)  # this one the run's default


def test_programs_name_adapters_in_gen_and_run_in_process_over_http_and_remote(server):
    engine = server.engine

    def engine_text(prefix: str, lora: str | None) -> str:
        out = engine.generate(prefix, {"temperature": 0, "max_new_tokens": NEW, "ignore_eos": True}, lora=lora)
        return out.text

    a = engine_text("Here is a tip:", "a0")
    want = {None: (a, engine_text("Here is a tip:" + a, None)), "a0": (a, engine_text("Here is a tip:" + a, "a0"))}
    assert want[None][1] != want["a0"][1]  # the run's adapter changes the second gen
    for backend, remote in ((rl.EngineBackend(engine), False), (rl.Endpoint(server.url), False),
                            (rl.Endpoint(server.url), True)):  # remote: the IR carries lora to the server
        for lora in (None, "a0"):
            state = tip.run(backend=backend, remote=remote, lora=lora)
            assert state.error() is None and (state["a"], state["b"]) == want[lora], (backend, remote, lora)
    unknown = tip.run(backend=rl.EngineBackend(engine), lora="nope")
    assert "'nope' is not loaded" in str(unknown.error())
    server.wait_idle()
