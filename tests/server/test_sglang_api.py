"""SGLang's native API beyond /generate's basics (issue 25): model and server info, every field of SGLang's
SamplingParams, the fork join route, a generating health check. The in-process engine is the oracle."""
from __future__ import annotations

import gzip
import json
import re

import pytest

GREEDY = {"temperature": 0, "max_new_tokens": 16}
# SGLang 0.5.23's SamplingParams API fields (sglang/srt/sampling/sampling_params.py), written out, each with
# a value SGLang's clients send; the route must take them all
SGLANG_SAMPLING_FIELDS = {
    "max_new_tokens": 4, "stop": [], "stop_token_ids": [], "stop_regex": [], "temperature": 0.0, "top_p": 1.0,
    "top_k": -1, "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0,
    "min_new_tokens": 0, "n": 1, "beam_width": None, "json_schema": None, "regex": None, "ebnf": None,
    "structural_tag": None, "ignore_eos": False, "skip_special_tokens": True, "spaces_between_special_tokens": True,
    "no_stop_trim": False, "stream_interval": None, "logit_bias": None, "sampling_seed": None,
    "custom_params": None, "watermark": None,
}


def generate(server, params: dict, **body) -> dict:
    with server.client() as http:
        r = http.post("/generate", json={"text": "Hello world", "sampling_params": params, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_model_info_names_the_model_as_sglangs_client_reads_it(server, tiny_model_dir):
    with server.client() as http:
        info, alias = http.get("/get_model_info").json(), http.get("/model_info").json()
    assert info == alias
    assert info["model_path"] == info["tokenizer_path"] == str(tiny_model_dir)
    assert info["is_generation"] is True and info["has_image_understanding"] is False
    assert info["weight_version"] == "default" and info["preferred_sampling_params"] is None
    assert info["chat_template"] == server.engine.tokenizer.chat_template  # our Endpoint's fields stay
    # SGLang's from the HF config; this config.json names only the architecture, which transformers maps
    causal_lm = pytest.importorskip("transformers.models.auto.modeling_auto").MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    architectures = json.loads((tiny_model_dir / "config.json").read_text())["architectures"]
    assert info["architectures"] == architectures == [causal_lm[info["model_type"]]]


@pytest.mark.slow  # transformers parses the real model's GGUF metadata (the 49k vocabulary) field by field
def test_model_identity_of_a_gguf_is_transformers_config_of_it():
    from radixlang.runtime.models.loading.loader import default_model_path, model_identity

    transformers = pytest.importorskip("transformers")
    path = default_model_path()
    config = transformers.AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    causal_lm = transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    assert model_identity(path) == (config.model_type, (causal_lm[config.model_type],)) == ("llama", ("LlamaForCausalLM",))


def test_server_info_reports_the_resolved_config_and_live_counters(server):
    with server.client() as http:
        info, alias = http.get("/get_server_info").json(), http.get("/server_info").json()
    assert info.keys() == alias.keys()
    assert info["max_total_num_tokens"] == server.engine.pool_size
    assert info["context_length"] == server.engine.context_length
    assert info["schedule_policy"] == server.engine.config.schedule_policy
    assert "running_requests" in info["internal_states"][0]


def test_every_sglang_sampling_field_is_accepted_and_an_unknown_one_is_a_400(server):
    expected = server.engine.generate("Hello world", {"temperature": 0, "max_new_tokens": 4})
    assert generate(server, SGLANG_SAMPLING_FIELDS)["text"] == expected.text
    with server.client() as http:
        r = http.post("/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 1, "bogus": 1}})
    assert r.status_code == 400 and "bogus" in r.json()["error"]["message"]


@pytest.mark.parametrize("field, value, words", [
    ("beam_width", 2, "beam search is not supported"),
    ("ebnf", 'root ::= "a" item', "undefined rule(s) ['item']"),
    ("ebnf", "root ::= [b-a]", "reversed at line 1, column 11"),
    ("watermark", {"key": 1}, "watermarking is not supported"),
    ("stop_regex", "(", "not a valid regular expression"),
    ("stop_regex", "a*", "matches the empty string"),
    ("logit_bias", {"999999": 1.0}, "token ids in [0,"),
    ("custom_params", [1], "must be a JSON object"),
])
def test_sglang_fields_radixlang_cannot_honour_are_400s_naming_them(server, field, value, words):
    with server.client() as http:
        r = http.post("/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 1, field: value}})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == f"sampling_params.{field}" and words in error["message"]


def test_ebnf_constrains_generate_and_the_openai_routes(server):
    from tests.runtime.constrained.test_ebnf import CITY_EBNF, CITY_RE

    params = {"ebnf": CITY_EBNF, "temperature": 1.0, "max_new_tokens": 24}
    texts = [generate(server, params | {"seed": seed}) for seed in range(4)]
    assert all(t["meta_info"]["finish_reason"]["type"] == "stop" for t in texts)
    assert all(re.fullmatch(CITY_RE, t["text"]) for t in texts) and len({t["text"] for t in texts}) > 1
    with server.client() as http:
        chat = http.post("/v1/chat/completions", json={"model": "default", "ebnf": CITY_EBNF, "max_tokens": 24,
                                                        "messages": [{"role": "user", "content": "A city?"}]})
        both = http.post("/v1/completions", json={"model": "default", "prompt": "x", "ebnf": CITY_EBNF,
                                                  "regex": "a"})
    assert chat.status_code == 200, chat.text
    assert re.fullmatch(CITY_RE, chat.json()["choices"][0]["message"]["content"])
    assert both.status_code == 400 and both.json()["error"]["param"] in ("ebnf", "regex")


def test_stop_regex_ends_the_output_at_its_first_match(server):
    full = server.engine.generate("Hello world", GREEDY).text
    word = re.search(r"\w{3,}", full[4:]).group()  # a word the greedy output contains after its start
    pattern = re.escape(word[:2]) + r"\w"
    first = re.search(pattern, full)
    body = generate(server, GREEDY | {"stop_regex": pattern})
    assert body["text"] == full[:first.start()]
    assert body["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}
    kept = generate(server, GREEDY | {"stop_regex": [pattern], "no_stop_trim": True})
    assert kept["text"] == full[:first.end()]


def test_logit_bias_adds_to_the_logits(server):
    top = generate(server, {"temperature": 0, "max_new_tokens": 1}, return_logprob=True, top_logprobs_num=2)
    (lp_a, a, _), (lp_b, b, _) = top["meta_info"]["output_top_logprobs"][0]
    assert top["output_ids"] == [a]
    # the runner-up wins once its bias exceeds the gap, and loses just below it
    gap = lp_a - lp_b
    assert generate(server, {"temperature": 0, "max_new_tokens": 1, "logit_bias": {str(b): gap + 0.05}}
                    )["output_ids"] == [b]
    assert generate(server, {"temperature": 0, "max_new_tokens": 1, "logit_bias": {str(b): gap - 0.05}}
                    )["output_ids"] == [a]
    forced = generate(server, {"temperature": 0.8, "seed": 3, "max_new_tokens": 3, "logit_bias": {str(b): 100}})
    assert forced["output_ids"] == [b, b, b]


def test_sampling_seed_is_sglangs_name_for_seed(server):
    params = {"temperature": 1.0, "max_new_tokens": 8}
    assert generate(server, params | {"sampling_seed": 11})["text"] == generate(server, params | {"seed": 11})["text"]
    with server.client() as http:
        r = http.post("/generate", json={"text": "x", "sampling_params": params | {"seed": 1, "sampling_seed": 2}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "sampling_params.sampling_seed"


def test_stream_events_count_the_logprobs_so_far_as_sglang_does(server, read_sse):
    body = {"text": "Hello world", "sampling_params": GREEDY, "stream": True, "return_logprob": True}
    with server.client() as http, http.stream("POST", "/generate", json=body) as r:
        events = read_sse(r)[:-1]
    assert len(events) > 1
    for e in events:
        meta = e["meta_info"]
        assert meta["output_token_logprobs_length"] == len(meta["output_token_logprobs"]) == meta["completion_tokens"]


def test_incremental_streaming_output_sends_what_is_new_as_sglangs_option_does(server_factory, read_sse):
    server = server_factory(incremental_streaming_output=True)
    body = {"text": "Hello world", "sampling_params": GREEDY | {"ignore_eos": True}, "stream": True,
            "return_logprob": True, "top_logprobs_num": 2}
    with server.client() as http:
        whole = http.post("/generate", json=body | {"stream": False}).json()
        with http.stream("POST", "/generate", json=body) as r:
            events = read_sse(r)[:-1]
        assert http.get("/get_server_info").json()["incremental_streaming_output"] is True
    assert len(events) > 1
    done = 0
    for e in events:  # SGLang's own test_stream_logprobs checks these
        meta = e["meta_info"]
        assert meta["completion_tokens"] == meta["output_token_logprobs_length"]
        assert len(meta["output_token_logprobs"]) == meta["completion_tokens"] - done
        done = meta["completion_tokens"]
    assert "".join(e["text"] for e in events) == whole["text"]
    assert sum((e["output_ids"] for e in events), []) == whole["output_ids"]
    streamed = sum((e["meta_info"]["output_token_logprobs"] for e in events), [])
    assert [t[1] for t in streamed] == whole["output_ids"]  # one logprob per token, in order
    assert [t[0] for t in streamed] == pytest.approx([t[0] for t in whole["meta_info"]["output_token_logprobs"]],
                                                     abs=1e-4)  # the two runs batch differently
    tops = sum((e["meta_info"]["output_top_logprobs"] for e in events), [])
    assert [[t[1] for t in top] for top in tops] == [[t[1] for t in top] for top in whole["meta_info"]["output_top_logprobs"]]
    assert len(events[-1]["meta_info"]["input_token_logprobs"]) == len(whole["meta_info"]["input_token_logprobs"])


def test_stream_interval_sends_an_event_every_k_tokens(server, read_sse):
    body = {"text": "Hello world", "sampling_params": GREEDY | {"ignore_eos": True, "stream_interval": 5},
            "stream": True}
    with server.client() as http, http.stream("POST", "/generate", json=body) as r:
        events = read_sse(r)[:-1]
    assert [e["meta_info"]["completion_tokens"] for e in events] == [5, 10, 15, 16]
    assert events[-1]["text"] == server.engine.generate("Hello world", GREEDY | {"ignore_eos": True}).text


def test_concatenate_and_append_is_accepted_and_its_body_checked(server):
    with server.client() as http:
        ok = http.post("/concate_and_append_request", json={"src_rids": ["a", "b"], "dst_rid": "c"})
        bad = http.post("/concate_and_append_request", json={"src_rids": "a"})
    assert ok.status_code == 200 and ok.json()["success"] is True
    assert bad.status_code == 422


def test_health_generate_generates_a_token(server):
    before = server.engine.stats()["generated_tokens_total"]
    with server.client() as http:
        r = http.get("/health_generate")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    assert server.engine.stats()["generated_tokens_total"] > before


def trace_ops(path) -> set[str]:
    """The operator names a Chrome trace recorded (the profiler's own export, read back)."""
    with gzip.open(path, "rt") as f:
        return {e["name"] for e in json.load(f)["traceEvents"] if e.get("cat") == "cpu_op"}


def test_start_and_stop_profile_write_a_torch_trace_of_the_model_steps(server, tmp_path):
    with server.client() as http:
        started = http.post("/start_profile", json={"output_dir": str(tmp_path), "profile_id": "run1",
                                                    "activities": ["CPU"], "record_shapes": True})
        again = http.get("/start_profile")
        http.post("/generate", json={"text": "Hello", "sampling_params": {"max_new_tokens": 3}})
        stopped = http.post("/stop_profile")
        stray = http.get("/stop_profile")
    assert started.status_code == 200 and started.text.startswith("Start profiling.")
    assert again.status_code == 400 and "already in progress" in again.json()["error"]["message"]
    path = tmp_path / "run1-TP-0.trace.json.gz"  # SGLang's name for rank 0's trace
    assert stopped.status_code == 200 and str(path) in stopped.text
    ops = trace_ops(path)  # the model's forward: its linears on torch's matmul or the fixed-order fp32 kernel
    assert {"aten::embedding", "aten::silu"} <= ops and ops & {"aten::linear", "radixlang_cpu::dense_mm"}
    assert stray.status_code == 400 and "not in progress" in stray.json()["error"]["message"]


def test_a_profile_of_num_steps_stops_on_its_own(server, tmp_path):
    with server.client() as http:
        assert http.post("/start_profile", json={"output_dir": str(tmp_path), "num_steps": 2,
                                                 "profile_prefix": "p-", "profile_id": "x"}).status_code == 200
        http.post("/generate", json={"text": "Hello", "sampling_params": {"max_new_tokens": 6, "ignore_eos": True}})
        assert http.post("/stop_profile").status_code == 400  # already stopped, after 2 of the 6 steps
    assert "aten::embedding" in trace_ops(tmp_path / "p-x-TP-0.trace.json.gz")


@pytest.mark.parametrize("body, param", [({"activities": ["RPD"]}, "activities"), ({"start_step": 3}, "start_step"),
                                         ({"profile_by_stage": True}, "profile_by_stage")])
def test_profile_options_radixlang_lacks_are_400s_naming_them(server, body, param):
    with server.client() as http:
        r = http.post("/start_profile", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param
    assert not server.engine.profiler.running
