"""Wiring: loads the model and builds the KV memory, cache, attention backend, runner and scheduler."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from ..kernels.backend import AttentionBackend
from ..kernels.registry import create_backend
from .config import HOST_TIER_MEM_FRACTION, HOST_TIER_POOLS, EngineConfig, available_memory_bytes
from .constrained.jump_forward import JumpForwarder
from .distributed.dp_runner import DPRunner
from .distributed.embedding_cache import BroadcastEmbeddingCache
from .distributed.group import TensorParallel
from .distributed.layers import kv_heads_per_rank
from .distributed.runner import TPRunner
from .distributed.workers import TPWorkers
from .execution.cuda_graph import DecodeGraphs
from .execution.dp_engine_core import DPEngineCore
from .execution.engine_core import EngineCore
from .execution.model_runner import ModelRunner
from .execution.output_processor import OutputProcessor
from .kv.kv_manager import KVManager
from .kv.memory import KVPool, ReqToToken, SlotAllocator
from .kv.radix_cache import RadixCache
from .lora.pool import LoraPool
from .model_loading import load_model
from .models.compiled import BackgroundCompile, warm_marker
from .models.llama import LlamaForCausalLM
from .multimodal.encoder import ImageEncoder
from .multimodal.prompt import ImagePrompts
from .scheduling.scheduler import Scheduler
from .speculative.drafter import create_drafter
from .tokenizer import Tokenizer


@dataclass(slots=True)
class EngineParts:
    core: EngineCore | DPEngineCore
    tokenizer: Tokenizer
    model_name: str
    vocab_size: int
    pool_size: int
    image_prompts: ImagePrompts | None = None  # None: a text-only model
    image_encoder: ImageEncoder | None = None
    decode_compile: BackgroundCompile | None = None  # None: decode stays eager
    lora: LoraPool | None = None  # the LoRA adapters served; None: this model and setup serve none


def create_scheduler(cfg: EngineConfig) -> EngineParts:
    """Loads the model and builds the KV memory, cache, attention backend, runner, scheduler and output
    processor (no thread)."""
    device, dtype, dp = cfg.torch_device(), cfg.torch_dtype(), cfg.dp_size()
    tp = TensorParallel.on(0, cfg.tp_size, device)
    loaded = load_model(cfg.model, device, dtype, tp, quantization=cfg.load_quantization(), ep_size=cfg.ep_size,
                        dp_attention=cfg.enable_dp_attention)
    mcfg = loaded.model.config
    context_length = cfg.context_length or mcfg.max_position
    if context_length > mcfg.max_position:
        raise ValueError(f"context_length {context_length} exceeds the model's {mcfg.max_position}")
    # each rank's pool holds its own heads; under DP attention all of them, for its own requests only
    kv_heads = kv_heads_per_rank(mcfg.num_kv_heads, tp.size // dp)
    latent = getattr(mcfg, "latent_kv", False)  # MLA: one latent row per token, K and V one buffer
    # under DP attention each rank holds its share of the whole capacity
    pool_size = max(2, kv_pool_size(cfg, mcfg.num_layers, kv_heads, mcfg.head_dim, dtype, context_length, latent) // dp)
    pool = KVPool(pool_size, mcfg.num_layers, kv_heads, mcfg.head_dim, dtype, device, shared_kv=latent,
                  kv_cache_dtype=cfg.kv_cache_dtype)
    kv = kv_owner(cfg, pool, context_length, device, kv_host_tier_size(cfg, pool))
    shared_prefix = [] if cfg.shared_prefix_file is None else shared_prefix_ids(cfg.shared_prefix_file, loaded.tokenizer)
    if shared_prefix:
        kv.share_prefix(shared_prefix)
    attn = create_backend(cfg.attention_backend, pool.k_buffers, pool.v_buffers, pool.scales)
    decode_compile = start_background_compile(cfg, loaded.model, pool)
    graphs = None
    if cfg.use_decode_graphs() and tp.size == 1:  # under TP every step must reach the workers: eager
        capture = device.type == "cuda" and getattr(loaded.model, "capturable", True)  # MoE routing syncs
        graphs = DecodeGraphs(loaded.model, attn, kv.req_to_token.table, pool.pad_slot, cfg.decode_graph_max_bs(),
                              capture=capture)
    vision = loaded.vision
    if vision is not None and tp.size > 1 and cfg.image_cache_mb == 0:
        raise ValueError("image_cache_mb must be > 0 with tp_size > 1: the worker ranks take image embeddings "
                         "from their mirror of rank 0's cache")
    workers = None if tp.size == 1 else TPWorkers(cfg, tp, pool_size, device)
    encoder = None
    if vision is not None:
        publish = None if workers is None else workers.publish_embedding
        encoder = ImageEncoder(vision.module, BroadcastEmbeddingCache(cfg.image_cache_mb, publish), device, dtype)
    image_token_id = 0 if vision is None else vision.image_token_id
    jump = None if cfg.disable_jump_forward else JumpForwarder(loaded.tokenizer)
    core: EngineCore | DPEngineCore
    lora = None
    if workers is None and type(loaded.model) is LlamaForCausalLM:  # dense Llama family, one rank
        lora = LoraPool(mcfg, cfg.max_loras_per_batch, cfg.max_lora_rank, device, dtype,
                        exact=cfg.load_quantization() == "none")
    if workers is not None and dp > 1:
        core = create_dp_core(cfg, loaded.model, kv, attn, workers, jump, shared_prefix)
    else:
        if workers is None:
            runner = ModelRunner(loaded.model, kv.req_to_token, attn, device, graphs, encoder, image_token_id, lora)
        else:
            runner = TPRunner(loaded.model, kv.req_to_token, attn, device, workers, encoder, image_token_id)
        drafter = create_drafter(cfg, loaded, pool_size, context_length)
        scheduler = Scheduler(cfg, kv, context_length, drafter=drafter, lora=lora)
        core = EngineCore(scheduler, runner, OutputProcessor(kv, context_length, scheduler.counters, jump, drafter))
    return EngineParts(core, loaded.tokenizer, loaded.name, mcfg.vocab_size, pool_size,
                       None if vision is None else ImagePrompts(vision), encoder, decode_compile, lora)


def kv_owner(cfg: EngineConfig, pool: KVPool, context_length: int, device: torch.device,
             host_tokens: int = 0) -> KVManager:
    """The KV owner of one pool: its slot allocator, request table and radix cache."""
    allocator = SlotAllocator(pool.num_slots, device)
    cache = RadixCache(allocator.free, disable=cfg.disable_radix_cache, device=device)
    req_to_token = ReqToToken(cfg.max_running_requests, context_length, device)
    return KVManager(pool, allocator, req_to_token, cache, cfg.max_pinned_fraction, host_tokens,
                     max_pinned_tokens_per_tenant=cfg.max_pinned_tokens_per_tenant)


def create_dp_core(cfg: EngineConfig, model: LlamaForCausalLM, first: KVManager, attn: AttentionBackend,
                   workers: TPWorkers, jump: JumpForwarder | None, shared_prefix: list[int]) -> DPEngineCore:
    """DP attention: rank 0's KV owner (`first`, over its pool here) and one per worker rank, over the slots
    of that rank's pool there; a scheduler and an output processor on each."""
    context_length = first.req_to_token.table.shape[1]
    owners = [first] + [kv_owner(cfg, KVPool.elsewhere(first.num_slots), context_length, workers.device)
                        for _ in range(1, cfg.dp_size())]
    for kv in owners[1:] if shared_prefix else ():
        kv.share_prefix(shared_prefix)
    runner = DPRunner(model, [kv.req_to_token for kv in owners], attn, workers.device, workers)
    ranks = []
    for kv in owners:
        scheduler = Scheduler(cfg, kv, context_length)
        ranks.append(EngineCore(scheduler, runner, OutputProcessor(kv, context_length, scheduler.counters, jump)))
    return DPEngineCore(ranks, runner)


def shared_prefix_ids(path: str, tokenizer: Tokenizer) -> list[int]:
    """The token ids of the shared prefix file: its text as it begins prompts (a chat template's rendering of
    a system message, special tokens written out), tokenized as a prompt is."""
    ids = tokenizer.encode(Path(path).read_text(encoding="utf-8"))
    if not ids:
        raise ValueError(f"shared_prefix_file {path} holds no text")
    return ids


def start_background_compile(cfg: EngineConfig, model: LlamaForCausalLM, pool: KVPool) -> BackgroundCompile | None:
    """The compiled decode forward, built in a background thread while the engine serves eagerly."""
    marker = warm_marker(f"{cfg.model or 'default'}-{cfg.load_quantization()}-{cfg.torch_dtype()}")
    if not cfg.compiles_decode(marker.exists()):
        return None
    make_backend = functools.partial(create_backend, cfg.attention_backend)
    return BackgroundCompile(model, make_backend, pool.k_buffers, pool.v_buffers, marker, pool.scales)


def kv_host_tier_size(cfg: EngineConfig, pool: KVPool) -> int:
    """Tokens of the host KV tier: the option, or by default HOST_TIER_POOLS device pools within
    HOST_TIER_MEM_FRACTION of the host's available memory (none where no tier can serve)."""
    if cfg.kv_host_cache_tokens is not None:
        return cfg.kv_host_cache_tokens
    if cfg.tp_size > 1 or cfg.disable_radix_cache:
        return 0
    fits = int(HOST_TIER_MEM_FRACTION * available_memory_bytes(torch.device("cpu")) / pool.token_bytes)
    return min(HOST_TIER_POOLS * pool.num_slots, fits)


def kv_pool_size(cfg: EngineConfig, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 context_length: int, shared_kv: bool = False) -> int:
    if cfg.kv_cache_tokens is not None:
        return cfg.kv_cache_tokens
    per_token = KVPool.bytes_per_token(layers, kv_heads, head_dim, dtype, shared_kv, cfg.kv_cache_dtype)
    tokens = int(cfg.mem_fraction * available_memory_bytes(cfg.torch_device()) / per_token)
    return max(2, min(tokens, cfg.max_running_requests * context_length))
