"""Wiring: loads the model and builds the KV memory, cache, attention backend, runner and scheduler."""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..kernels.registry import create_backend
from .config import HOST_TIER_MEM_FRACTION, HOST_TIER_POOLS, EngineConfig, available_memory_bytes
from .constrained.jump_forward import JumpForwarder
from .cuda_graph import DecodeGraphs
from .distributed.embedding_cache import BroadcastEmbeddingCache
from .distributed.group import TensorParallel
from .distributed.layers import kv_heads_per_rank
from .distributed.runner import TPRunner
from .distributed.workers import TPWorkers
from .engine_core import EngineCore
from .kv_manager import KVManager
from .memory import KVPool, ReqToToken, SlotAllocator
from .model_loading import load_model
from .model_runner import ModelRunner
from .models.compiled import BackgroundCompile, warm_marker
from .models.llama import LlamaForCausalLM
from .multimodal.encoder import ImageEncoder
from .multimodal.prompt import ImagePrompts
from .output_processor import OutputProcessor
from .radix_cache import RadixCache
from .scheduler import Scheduler
from .speculative.drafter import create_drafter
from .tokenizer import Tokenizer


@dataclass(slots=True)
class EngineParts:
    core: EngineCore
    tokenizer: Tokenizer
    model_name: str
    vocab_size: int
    pool_size: int
    image_prompts: ImagePrompts | None = None  # None: a text-only model
    image_encoder: ImageEncoder | None = None
    decode_compile: BackgroundCompile | None = None  # None: decode stays eager


def create_scheduler(cfg: EngineConfig) -> EngineParts:
    """Loads the model and builds the KV memory, cache, attention backend, runner, scheduler and output
    processor (no thread)."""
    device, dtype = cfg.torch_device(), cfg.torch_dtype()
    tp = TensorParallel(0, cfg.tp_size)
    loaded = load_model(cfg.model, device, dtype, tp, quantization=cfg.load_quantization(), ep_size=cfg.ep_size)
    mcfg = loaded.model.config
    context_length = cfg.context_length or mcfg.max_position
    if context_length > mcfg.max_position:
        raise ValueError(f"context_length {context_length} exceeds the model's {mcfg.max_position}")
    kv_heads = kv_heads_per_rank(mcfg.num_kv_heads, tp.size)  # each rank's pool holds its own heads
    latent = getattr(mcfg, "latent_kv", False)  # MLA: one latent row per token, K and V one buffer
    pool_size = kv_pool_size(cfg, mcfg.num_layers, kv_heads, mcfg.head_dim, dtype, context_length, latent)
    pool = KVPool(pool_size, mcfg.num_layers, kv_heads, mcfg.head_dim, dtype, device, shared_kv=latent)
    allocator = SlotAllocator(pool_size, device)
    req_to_token = ReqToToken(cfg.max_running_requests, context_length, device)
    cache = RadixCache(allocator.free, disable=cfg.disable_radix_cache, device=device)
    attn = create_backend(cfg.attention_backend, pool.k_buffers, pool.v_buffers)
    decode_compile = start_background_compile(cfg, loaded.model, pool)
    graphs = None
    if cfg.use_decode_graphs() and tp.size == 1:  # under TP every step must reach the workers: eager
        capture = device.type == "cuda" and getattr(loaded.model, "capturable", True)  # MoE routing syncs
        graphs = DecodeGraphs(loaded.model, attn, req_to_token.table, pool.pad_slot, cfg.decode_graph_max_bs(),
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
    if workers is None:
        runner = ModelRunner(loaded.model, req_to_token, attn, device, graphs, encoder, image_token_id)
    else:
        runner = TPRunner(loaded.model, req_to_token, attn, device, workers, encoder, image_token_id)
    jump = None if cfg.disable_jump_forward else JumpForwarder(loaded.tokenizer)
    kv = KVManager(pool, allocator, req_to_token, cache, cfg.max_pinned_fraction, kv_host_tier_size(cfg, pool))
    drafter = create_drafter(cfg, loaded, pool_size, context_length)
    scheduler = Scheduler(cfg, kv, context_length, drafter=drafter)
    outputs = OutputProcessor(kv, context_length, scheduler.counters, jump, drafter)
    return EngineParts(EngineCore(scheduler, runner, outputs), loaded.tokenizer, loaded.name, mcfg.vocab_size,
                       pool_size, None if vision is None else ImagePrompts(vision), encoder, decode_compile)


def start_background_compile(cfg: EngineConfig, model: LlamaForCausalLM, pool: KVPool) -> BackgroundCompile | None:
    """The compiled decode forward, built in a background thread while the engine serves eagerly."""
    marker = warm_marker(f"{cfg.model or 'default'}-{cfg.load_quantization()}-{cfg.torch_dtype()}")
    if not cfg.compiles_decode(marker.exists()):
        return None
    make_backend = functools.partial(create_backend, cfg.attention_backend)
    return BackgroundCompile(model, make_backend, pool.k_buffers, pool.v_buffers, marker)


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
    per_token = KVPool.bytes_per_token(layers, kv_heads, head_dim, dtype, shared_kv)
    tokens = int(cfg.mem_fraction * available_memory_bytes(cfg.torch_device()) / per_token)
    return max(2, min(tokens, cfg.max_running_requests * context_length))
