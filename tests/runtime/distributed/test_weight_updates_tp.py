"""Live weight updates under tensor parallelism (2 CPU ranks, gloo): a checkpoint and named tensors reach every
rank's shard -- greedy equals transformers on the new weights and no KV of the old ones is reused -- and a
mismatch leaves every rank on the old weights."""
from __future__ import annotations

import pytest
import transformers

from radixlang.runtime.engine import Engine
from tests.runtime.test_weight_updates import greedy, hf_greedy, save_checkpoints


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("weights-tp")
    return (root, *save_checkpoints(root))


def test_updates_reach_every_tensor_parallel_rank(checkpoints):
    root, old, new = checkpoints
    with Engine(model=str(root / "a"), device="cpu", kv_cache_tokens=2048, quantization="none", tp_size=2,
                compile_layers=False) as engine:
        assert greedy(engine)[0] == hf_greedy(old)

        engine.update_weights_from_disk(str(root / "b"), weight_version="step-1")
        assert greedy(engine) == (hf_greedy(new), 0)

        # whole HF tensors, each rank takes its shard: a part of the fused q|k|v (column-parallel), a row-parallel
        # o_proj, half of gate|up, and the vocabulary-split head
        changed = ["model.layers.0.self_attn.k_proj.weight", "model.layers.1.self_attn.o_proj.weight",
                   "model.layers.0.mlp.up_proj.weight", "lm_head.weight"]
        given = {name: old.state_dict()[name] for name in changed}
        engine.update_weights_from_tensor(list(given.items()), weight_version="step-2")
        mixed = transformers.LlamaForCausalLM(new.config).eval()
        mixed.load_state_dict(new.state_dict() | given)
        assert greedy(engine) == (hf_greedy(mixed), 0)

        with pytest.raises(ValueError, match=r"gate_up_proj.*\(256, 64\).*\(128, 64\)"):
            engine.update_weights_from_disk(str(root / "wide"))
        assert engine.weight_version == "step-2"
        assert greedy(engine)[0] == hf_greedy(mixed)  # every rank still on the same weights
        engine.check_invariants()
