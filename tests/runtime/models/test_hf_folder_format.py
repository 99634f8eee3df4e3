"""An HF text-model folder as transformers 5 saves it: the chat template in chat_template.jinja (not in
tokenizer_config.json), rope settings under rope_parameters; each read as transformers reads them."""
from __future__ import annotations

import json

import pytest
import torch

from radixlang.runtime.engine import Engine
from radixlang.runtime.tokenizer import Tokenizer

from .hf_tiny import BASE, save_hf_model

transformers = pytest.importorskip("transformers")
TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>"
            "{{ m['content'] }}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}<|start_header_id|>"
            "assistant<|end_header_id|>{% endif %}")
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there, ünïcode?"}]


def test_a_tokenizer_saved_by_transformers_5_renders_and_encodes_as_transformers(tmp_path):
    config = transformers.LlamaConfig(**(BASE | dict(rope_theta=50000.0)))
    model = save_hf_model(tmp_path, config)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(str(tmp_path))
    assert (tmp_path / "chat_template.jinja").read_text() == TEMPLATE
    assert "chat_template" not in json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert "rope_parameters" in json.loads((tmp_path / "config.json").read_text())

    ours = Tokenizer.from_hf_dir(tmp_path)
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert ours.apply_chat_template(MESSAGES) == text
    assert ours.encode(text, add_special_tokens=False) == tokenizer(text, add_special_tokens=False)["input_ids"]

    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        want = model.generate(torch.tensor([ids]), max_new_tokens=5, do_sample=False)[0, len(ids):].tolist()
    with Engine(str(tmp_path), kv_cache_tokens=256, device="cpu") as engine:
        got = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 5, "temperature": 0,
                                                              "ignore_eos": True})
        engine.check_invariants()
    assert got.output_ids == want
