"""The sharded Llama in one process: two ranks as threads over an in-process gloo group, against the
unsharded model on the same weights. Covers what the engine test's model does not: biases on every
linear, a tied head, a vocabulary that does not split evenly, and a replicated KV head."""
from __future__ import annotations

import datetime
import threading

import torch
import torch.distributed as dist

from radixlang.kernels.backend import AttentionBatch
from radixlang.kernels.reference import TorchAttention
from radixlang.runtime.distributed.group import TensorParallel
from radixlang.runtime.distributed.layers import kv_heads_per_rank
from radixlang.runtime.kv.memory import KVPool
from radixlang.runtime.models.llama import ForwardContext
from radixlang.runtime.models.loading.hf_config import config_from_hf
from radixlang.runtime.models.loading.loader import build_model
from radixlang.server.cli import _engine_options, build_parser, main
from tests.conftest import TINY_CONFIG, tiny_weights

CONFIG = TINY_CONFIG | {"vocab_size": 1001, "num_key_value_heads": 1, "tie_word_embeddings": True,
                        "attention_bias": True, "mlp_bias": True}


def _weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    w = {k: v for k, v in tiny_weights(CONFIG).items() if k != "lm_head.weight"}
    for name, t in list(w.items()):
        if name.endswith("_proj.weight"):
            w[name.replace(".weight", ".bias")] = torch.randn(t.shape[0], generator=g) * 0.1
    return w


def _logits(tp: TensorParallel, ids: torch.Tensor) -> torch.Tensor:
    """One prefill of `ids` through this rank's shard of the model: [len(ids), vocab] on rank 0."""
    cfg = config_from_hf(CONFIG)
    model = build_model(cfg, _weights().items(), torch.device("cpu"), torch.float32, tp)
    pool = KVPool(64, cfg.num_layers, kv_heads_per_rank(cfg.num_kv_heads, tp.size), cfg.head_dim,
                  torch.float32, torch.device("cpu"))
    attn = TorchAttention(pool.k_buffers, pool.v_buffers)
    n = len(ids)
    table = torch.arange(n, dtype=torch.int32)[None, :]
    plan = attn.plan(AttentionBatch(table, [0], [n], [n], list(range(n)), [None]))
    with torch.inference_mode():
        return model.compute_logits(model(ids, plan.positions, ForwardContext(attn)))


def test_two_ranks_compute_the_logits_of_the_unsharded_model():
    ids = torch.tensor([5, 999, 1000, 17, 500, 3, 42], dtype=torch.int64)  # ids in both vocabulary halves
    want = _logits(TensorParallel(), ids)
    store, got, errors = dist.HashStore(), {}, []

    def rank(r: int) -> None:
        try:
            opts = dist.ProcessGroupGloo._Options()
            opts._timeout = datetime.timedelta(seconds=60)
            opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
            got[r] = _logits(TensorParallel(r, 2, dist.ProcessGroupGloo(store, r, 2, opts)), ids)
        except Exception as e:  # noqa: BLE001 - re-raised by the test
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert got[0].shape == want.shape == (len(ids), 1001)
    assert torch.allclose(got[0], want, atol=1e-4, rtol=1e-4)
    assert torch.equal(got[0].argmax(-1), want.argmax(-1))


def test_tp_flag_and_its_long_spelling_set_tp_size():
    for flag in ("--tp", "--tp-size"):
        args = build_parser().parse_args(["serve", flag, "3"])
        assert _engine_options(args) == {"tp_size": 3}


def test_dp_attention_takes_sglangs_flags_and_dp_counts_its_ranks(capsys):
    for flag in ("--enable-dp-attention", "--dp-attention"):
        args = build_parser().parse_args(["serve", "--tp", "2", flag])
        assert _engine_options(args) == {"tp_size": 2, "enable_dp_attention": True}
    # SGLang's `--tp 2 --dp 2 --enable-dp-attention` is one engine; a --dp other than --tp is refused before loading
    assert main(["serve", "--tp", "2", "--dp", "4", "--enable-dp-attention"]) == 2
    assert "must equal --tp (2), got 4" in capsys.readouterr().err
