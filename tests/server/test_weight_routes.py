"""SGLang's live weight routes over HTTP (issue 46), as an RL framework's rollout client calls them: the update
answers SGLang's {"success", "message"}, the new version shows in /get_model_info and every /generate's
meta_info, the tokens are transformers' on the new weights, and a mismatch is a 400 that leaves them serving.
/update_weights_from_tensor takes base64 safetensors files (never a pickle)."""
from __future__ import annotations

import base64
import threading
import time

import pytest
import torch
from safetensors.torch import load_file, save

from ..runtime.models.hf_tiny import one_thread  # noqa: F401 (a fixture)
from ..runtime.test_weight_updates import GREEDY, PROMPT, hf_greedy, save_checkpoints
from .conftest import serving

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("routes")
    _, new = save_checkpoints(root)
    return root, hf_greedy(new)


def generate(http) -> dict:
    r = http.post("/generate", json={"input_ids": PROMPT, "sampling_params": GREEDY})
    assert r.status_code == 200, r.text
    return r.json()


def test_update_weights_from_disk_route(folders):
    root, new_tokens = folders
    with serving(root / "a", quantization="none") as live, live.client() as http:
        assert generate(http)["meta_info"]["weight_version"] == "default"
        assert generate(http)["meta_info"]["cached_tokens"] > 0

        r = http.post("/update_weights_from_disk", json={"model_path": str(root / "b"), "weight_version": "step-7"})
        assert r.status_code == 200 and r.json()["success"] is True, r.text

        assert http.get("/get_model_info").json()["weight_version"] == "step-7"
        out = generate(http)
        assert out["output_ids"] == new_tokens
        assert out["meta_info"]["cached_tokens"] == 0 and out["meta_info"]["weight_version"] == "step-7"

        r = http.post("/update_weights_from_disk", json={"model_path": str(root / "wide")})
        assert r.status_code == 400 and r.json()["success"] is False
        assert "gate_up_proj" in r.json()["message"]  # the tensor whose shape differs
        assert http.post("/update_weights_from_disk", json={"model_path": str(root / "b"),
                                                            "load_format": "npz"}).status_code == 422
        assert generate(http)["output_ids"] == new_tokens  # the new weights serve on
        live.wait_idle()


def encoded(tensors: dict[str, torch.Tensor]) -> str:
    """What a client sends: a safetensors file of HF-named tensors, base64."""
    return base64.b64encode(save(tensors)).decode()


def test_update_weights_from_tensor_route(folders):
    root, new_tokens = folders
    new = load_file(str(root / "b" / "model.safetensors"))
    with serving(root / "a", quantization="none") as live, live.client() as http:
        assert generate(http)["meta_info"]["cached_tokens"] == 0
        assert generate(http)["output_ids"] != new_tokens

        body = {"serialized_named_tensors": [encoded(new)] * 2, "weight_version": "t-1"}  # one per SGLang rank
        r = http.post("/update_weights_from_tensor", json=body)
        assert r.status_code == 200 and r.json()["success"] is True, r.text
        out = generate(http)
        assert out["output_ids"] == new_tokens
        assert out["meta_info"]["cached_tokens"] == 0 and out["meta_info"]["weight_version"] == "t-1"

        def refused(items: list[str], match: str, **extra) -> None:
            r = http.post("/update_weights_from_tensor", json={"serialized_named_tensors": items} | extra)
            assert r.status_code == 400 and r.json()["success"] is False and match in r.json()["message"], r.text

        refused([encoded({"model.layers.9.mlp.up_proj.weight": torch.zeros(128, 64)})], "unknown weight 'layers.9")
        refused([encoded({"model.layers.0.self_attn.k_proj.weight": torch.zeros(3, 3)})], "(3, 3)")
        refused(["not base64!"], "not base64")
        refused([base64.b64encode(b"\x80\x04pickle").decode()], "not a safetensors file")
        refused([encoded(new), encoded({})], "must be the same")
        assert http.post("/update_weights_from_tensor", json={"serialized_named_tensors": [encoded(new)],
                                                              "load_format": "pickle"}).status_code == 422
        assert generate(http)["output_ids"] == new_tokens  # the update's weights serve on
        assert http.get("/get_model_info").json()["weight_version"] == "t-1"
        live.wait_idle()


def test_pause_and_continue_generation_routes(folders):
    root, _ = folders
    with serving(root / "a", quantization="none") as live, live.client() as http:
        assert http.post("/pause_generation", json={}).json()["success"] is True
        done: list = []
        request = threading.Thread(target=lambda: done.append(generate(http)))
        request.start()
        deadline = time.monotonic() + 30
        while live.engine.stats()["waiting_requests"] == 0:  # it reaches the engine, and waits there
            assert time.monotonic() < deadline
            time.sleep(0.01)
        request.join(0.3)
        assert not done and live.engine.stats()["generated_tokens_total"] == 0  # no step while paused
        assert http.post("/continue_generation").json()["success"] is True
        request.join(30)
        assert done[0]["meta_info"]["finish_reason"]["type"] == "length"
        r = http.post("/pause_generation", json={"mode": "retract"})
        assert r.status_code == 422  # SGLang's retract mode is not taken
        live.wait_idle()
