"""A tensor-parallel worker rank (its own process): loads its shard of the model and KV pool, then runs
every step rank 0 sends, and keeps the image embeddings rank 0 broadcasts. It never schedules.

Started as `python -m radixlang.runtime.distributed.worker FD` (not multiprocessing's spawn, which
would re-run the user's main script): FD is a socket to rank 0, which sends the WorkerSpec first and
then pickled (kind, body) messages; the model's tensors travel through the process group's collectives.
"""
from __future__ import annotations

import dataclasses
import os
import pickle
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import torch

from ...kernels.registry import create_backend
from ..config import EngineConfig
from ..execution.model_runner import ModelRunner, StepInputs
from ..kv.memory import KVPool
from ..model_loading import load_model
from ..multimodal.prompt import embed_parts
from ..weight_sources import prepare
from .dp_step import run_dp_step
from .embedding_cache import EmbeddingMirror
from .group import TensorParallel, connect_store
from .layers import kv_heads_per_rank

# message kinds, rank 0 -> worker
STEP = "step"  # body: StepInputs with only the step's rows of req_to_token, on the host, images by reference
DP_STEP = "dp-step"  # body: DPStep, this rank's own batch under DP attention (its inputs as STEP's)
EMBEDDING = "embedding"  # body: (key, shape, dtype, evicted keys); the tensor follows as a broadcast
CALL = "call"  # body: a picklable function of the worker's EmbeddingMirror; the worker replies with its result
PLACE = "place"  # body: list[eplb.Placement], one per MoE layer, applied in step with rank 0
LOAD = "load"  # no body; the worker replies with its expert load (DP attention: each rank routes its own tokens)
UPDATE = "update"  # body: weight_sources.UpdateSource; the worker prepares it on its shard, replies None or the error
COMMIT = "commit"  # body: bool, apply the prepared update (True) or drop it; the worker replies when done
STOP = "stop"
# worker -> rank 0
LOADED = "loaded"
ERROR = "error"


@dataclass(slots=True)
class WorkerSpec:
    cfg: EngineConfig
    rank: int
    size: int
    port: int  # rank 0's rendezvous store
    pool_size: int  # KV slots: the same on every rank (each holds its own heads, or under DP attention its own requests)


def send(conn: Connection, kind: str, body: object = None) -> None:
    conn.send_bytes(pickle.dumps((kind, body)))


def receive(conn: Connection) -> tuple[str, Any]:
    return pickle.loads(conn.recv_bytes())


def rank_device(cfg: EngineConfig, rank: int) -> torch.device:
    """One GPU per rank; on the CPU every rank shares the host."""
    device = cfg.torch_device()
    return torch.device("cuda", rank) if device.type == "cuda" else device


def rank_threads(size: int) -> int:
    """Intra-op threads of each rank on the CPU: the ranks share the host's cores (more threads than cores
    spin-wait against each other, many times slower)."""
    return max(1, (os.cpu_count() or 1) // size)


def host_step(inputs: StepInputs) -> StepInputs:
    """The step with just its own rows of req_to_token (renumbered 0..n-1), on the host, ready to send:
    a worker has no request table of its own. Image embeddings travel as references into its mirror."""
    batch = inputs.attention
    rows = torch.tensor(batch.rows, dtype=torch.int64, device=batch.req_to_token.device)
    table = batch.req_to_token[rows, : max(batch.kv_lens)].cpu()
    attention = dataclasses.replace(batch, req_to_token=table, rows=list(range(len(batch.rows))))
    return StepInputs(inputs.input_ids, attention, inputs.hidden_rows, images=inputs.images)


def main(fd: int) -> None:
    """The worker process's entry point."""
    conn = Connection(fd)
    spec = pickle.loads(conn.recv_bytes())
    torch.set_grad_enabled(False)
    torch.set_num_threads(rank_threads(spec.size))
    timeout = spec.cfg.dist_timeout
    try:
        tp, runner = _build(spec)
        send(conn, LOADED)
        store = connect_store(spec.port, timeout)
        tp.join(store, runner.device, timeout)
    except Exception as e:  # noqa: BLE001 - reported to rank 0, which raises it
        send(conn, ERROR, f"{type(e).__name__}: {e}")
        return
    _serve(conn, tp, runner, EmbeddingMirror(), spec.cfg)
    # a worker holds nothing to save, and finalizing an interpreter holding torch, a model and a process
    # group takes seconds (rank 0 waits that long in close): leave at once
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _build(spec: WorkerSpec) -> tuple[TensorParallel, ModelRunner]:
    cfg, device, dtype = spec.cfg, rank_device(spec.cfg, spec.rank), spec.cfg.torch_dtype()
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL binds each rank to the current device
    tp = TensorParallel.on(spec.rank, spec.size, device)
    model = load_model(cfg.model, device, dtype, tp, quantization=cfg.load_quantization(), ep_size=cfg.ep_size,
                       dp_attention=cfg.enable_dp_attention).model
    mcfg = model.config
    attention_ranks = spec.size // cfg.dp_size()  # DP attention: every rank holds all the KV heads
    pool = KVPool(spec.pool_size, mcfg.num_layers, kv_heads_per_rank(mcfg.num_kv_heads, attention_ranks),
                  mcfg.head_dim, dtype, device, shared_kv=getattr(mcfg, "latent_kv", False),
                  kv_cache_dtype=cfg.kv_cache_dtype)
    attn = create_backend(cfg.attention_backend, pool.k_buffers, pool.v_buffers, pool.scales)
    return tp, ModelRunner(model, None, attn, device)


def _on_device(inputs: StepInputs, runner: ModelRunner, mirror: EmbeddingMirror) -> StepInputs:
    """A received step's table on this rank's device, its images' embeddings from the mirror."""
    inputs.attention.req_to_token = inputs.attention.req_to_token.to(runner.device)
    inputs.embeds = embed_parts(inputs.images, mirror.get, runner.device)
    return inputs


@torch.inference_mode()
def _serve(conn: Connection, tp: TensorParallel, runner: ModelRunner, mirror: EmbeddingMirror,
           cfg: EngineConfig) -> None:
    pending = None  # a prepared weight update, applied at COMMIT
    while True:
        try:
            kind, body = receive(conn)
        except EOFError:  # rank 0 is gone
            return
        if kind == STOP:
            return
        if kind == STEP:
            runner.run(_on_device(body, runner, mirror))
        elif kind == DP_STEP:
            _on_device(body.inputs, runner, mirror)
            run_dp_step(runner, tp, body)
        elif kind == EMBEDDING:
            key, shape, dtype, evicted = body
            mirror.add(key, tp.broadcast(torch.empty(shape, dtype=dtype, device=runner.device)), evicted)
        elif kind == CALL:  # a probe rank 0 sends (radixlang.testing.workers reads the mirror with it)
            send(conn, CALL, body(mirror))
        elif kind == PLACE:
            runner.place_experts(body)
        elif kind == LOAD:
            send(conn, LOAD, runner.expert_load())
        elif kind == UPDATE:
            try:
                pending = prepare(runner.model, body, cfg, tp, runner.device)[0]
                send(conn, UPDATE, None)
            except (ValueError, TypeError) as e:  # a mismatch: rank 0 drops the update on every rank
                send(conn, UPDATE, str(e))
            except Exception as e:  # noqa: BLE001 - any failure to prepare drops the update, the worker serves on
                send(conn, UPDATE, f"{type(e).__name__}: {e}")
        elif kind == COMMIT:
            if body and pending is not None:
                pending()
            pending = None
            send(conn, COMMIT, None)
        else:
            raise ValueError(f"unknown message kind {kind!r}")


if __name__ == "__main__":
    main(int(sys.argv[1]))
