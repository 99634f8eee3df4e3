"""A random-weight LLaVA folder in the HF layout, for demos and benchmarks on machines without trained
vision-language weights: every mechanism runs for real, and the text it generates is meaningless."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from ..runtime.models.llama import LlamaConfig, LlamaForCausalLM
from ..runtime.multimodal.llava import LLAVA, LlavaConfig, LlavaVision
from ..runtime.multimodal.vision import CLIP, VisionConfig
from ..runtime.tokenizer import bytes_to_unicode

SPECIALS = ["<s>", "</s>", "<image>"]
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'].upper() }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}ASSISTANT:{% endif %}")


@dataclass(frozen=True, slots=True)
class RandomLlavaSize:
    hidden: int = 256
    layers: int = 4
    image_size: int = 224
    patch_size: int = 14
    vision_hidden: int = 256
    vision_layers: int = 6


def write_random_llava(path: Path, size: RandomLlavaSize = RandomLlavaSize(), seed: int = 0) -> Path:
    """Writes config.json, model.safetensors, tokenizer files and preprocessor_config.json to `path`."""
    path.mkdir(parents=True, exist_ok=True)
    image_token_id, eos_id = _write_tokenizer(path)
    vocab = 288  # 256 bytes + the specials, padded as checkpoints pad their embeddings
    text = LlamaConfig(vocab_size=vocab, hidden_size=size.hidden, intermediate_size=2 * size.hidden,
                       num_layers=size.layers, num_heads=4, num_kv_heads=2, head_dim=size.hidden // 4,
                       max_position=4096)
    vision = VisionConfig(CLIP, size.vision_hidden, 4 * size.vision_hidden, size.vision_layers, 4,
                          size.image_size, size.patch_size)
    llava = LlavaConfig(vision, size.hidden, image_token_id, (-2,), "default")
    torch.manual_seed(seed)
    tensors = _text_weights(LlamaForCausalLM(text)) | {
        name: t for name, t in LlavaVision(llava).state_dict().items()}
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({
        "architectures": [LLAVA], "model_type": "llava", "image_token_index": image_token_id,
        "vision_feature_layer": -2, "vision_feature_select_strategy": "default", "projector_hidden_act": "gelu",
        "text_config": {"model_type": "llama", "vocab_size": vocab, "hidden_size": size.hidden,
                        "intermediate_size": 2 * size.hidden, "num_hidden_layers": size.layers,
                        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096,
                        "rms_norm_eps": 1e-5, "eos_token_id": eos_id},
        "vision_config": {"model_type": CLIP, "hidden_size": size.vision_hidden,
                          "intermediate_size": 4 * size.vision_hidden, "num_hidden_layers": size.vision_layers,
                          "num_attention_heads": 4, "image_size": size.image_size, "patch_size": size.patch_size},
    }))
    (path / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "CLIPImageProcessor", "do_resize": True, "size": {"shortest_edge": size.image_size},
        "do_center_crop": True, "crop_size": {"height": size.image_size, "width": size.image_size},
        "resample": 3, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True}))
    return path


def _write_tokenizer(path: Path) -> tuple[int, int]:
    """Byte-level BPE without merges (one token per byte) plus the specials; returns the ids of <image>
    and </s>."""
    tok = HFTokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(bytes_to_unicode().values())}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "add_bos_token": False, "chat_template": CHAT_TEMPLATE}))
    image_id, eos_id = tok.token_to_id("<image>"), tok.token_to_id("</s>")
    assert image_id is not None and eos_id is not None, "both are specials added above"
    return image_id, eos_id


def _text_weights(model: LlamaForCausalLM) -> dict[str, torch.Tensor]:
    """Our fused q/k/v and gate/up linears, unfused into HF's LLaVA names."""
    cfg = model.config
    out: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        if "qkv_proj" in name:
            q, k, v = t.split([cfg.num_heads * cfg.head_dim] + [cfg.num_kv_heads * cfg.head_dim] * 2)
            out |= {name.replace("qkv_proj", p): w for p, w in (("q_proj", q), ("k_proj", k), ("v_proj", v))}
        elif "gate_up_proj" in name:
            gate, up = t.chunk(2)
            out |= {name.replace("gate_up_proj", "gate_proj"): gate, name.replace("gate_up_proj", "up_proj"): up}
        else:
            out[name] = t
    return {(f"language_model.{k}" if k.startswith("lm_head") else f"language_model.model.{k}"): v
            for k, v in out.items()}
