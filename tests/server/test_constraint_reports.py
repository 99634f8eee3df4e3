"""/generate reports the JSON-schema keywords a constraint leaves unenforced, and refuses (400) a constraint
that misses the compile deadline; the output is checked with the `jsonschema` library."""
from __future__ import annotations

import json

import jsonschema

SCHEMA = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 3},
                                                    "uniqueItems": True, "maxItems": 3}},
          "required": ["tags"], "additionalProperties": False}  # open, undeclared members may run past max_new_tokens


def test_generate_reports_relaxed_keywords_and_refuses_past_the_compile_deadline(server_factory):
    relaxed = server_factory(constrained_json_relaxed="uniqueItems")
    with relaxed.client() as http:
        out = http.post("/generate", json={"text": "tags:", "sampling_params": {
            "json_schema": json.dumps(SCHEMA), "max_new_tokens": 120, "temperature": 0}}).json()
        value = json.loads(out["text"])
        jsonschema.validate(value, {**SCHEMA, "properties": {"tags": {**SCHEMA["properties"]["tags"],
                                                                      "uniqueItems": False}}})
        assert out["meta_info"]["unenforced_keywords"] == ["uniqueItems at #/properties/tags"]
        plain = http.post("/generate", json={"text": "n:", "sampling_params": {
            "json_schema": json.dumps({"type": "integer"}), "max_new_tokens": 4}}).json()
        assert "unenforced_keywords" not in plain["meta_info"]
    late = server_factory(constraint_compile_timeout=1e-9)
    with late.client() as http:
        refused = http.post("/generate", json={"text": "x", "sampling_params": {"regex": "[a-z]+",
                                                                                "max_new_tokens": 4}})
        assert refused.status_code == 400
        assert "compile deadline of 1e-09 s" in refused.text
        assert http.post("/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 2}}).status_code == 200
