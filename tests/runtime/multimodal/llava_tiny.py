"""Tiny random-weight LLaVA checkpoints built and saved by transformers itself (CLIP or SigLIP towers),
with the byte-level test tokenizer plus an <image> token, and a PIL image processor config."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from tokenizers import AddedToken

from tests.runtime.models.hf_tiny import VOCAB_SIZE, byte_tokenizer

IMAGE_TOKEN = "<image>"
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'].upper() }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}ASSISTANT:{% endif %}")
GREEDY = {"max_new_tokens": 6, "temperature": 0.0}
PROMPT = "USER: <image>\nWhat is it? ASSISTANT:"
IMAGE_SIZE, PATCH = 56, 14
TEXT = dict(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5)
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
              image_size=IMAGE_SIZE, patch_size=PATCH)


def write_tokenizer(path: Path) -> int:
    """Saves the tokenizer; returns the image token's id."""
    tok = byte_tokenizer()
    tok.add_special_tokens([AddedToken(IMAGE_TOKEN, special=True, normalized=False)])
    tok.save(str(path / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
           "add_bos_token": False, "chat_template": CHAT_TEMPLATE}
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    return tok.token_to_id(IMAGE_TOKEN)


@torch.no_grad()
def sharpen(model: torch.nn.Module, seed: int) -> None:
    """Redraws every weight so features and logits are far from uniform (greedy decoding is a sharp test)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=g)
        if p.dim() == 1 and "norm" in name and name.endswith("weight"):
            p.copy_(1.0 + 0.2 * noise)
        elif p.dim() == 1:
            p.copy_(0.5 * noise)
        elif "embed_tokens" in name or "lm_head" in name or "position_embedding" in name:
            p.copy_(noise * (2.0 if "lm_head" in name else 1.0))
        else:
            p.copy_(noise * 3.0 * p[0].numel() ** -0.5)


def save_llava(path: Path, tower: str = "clip", feature_layer: int | list[int] = -2,
               strategy: str = "default", seed: int = 0) -> torch.nn.Module:
    """Builds, sharpens and saves a LLaVA folder; returns the transformers model (fp32, eval)."""
    from transformers import (
        CLIPImageProcessorPil,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        SiglipImageProcessorPil,
        SiglipVisionConfig,
    )

    path.mkdir(parents=True, exist_ok=True)
    image_token_id = write_tokenizer(path)
    if tower == "clip":
        vision = CLIPVisionConfig(**VISION)
        processor = CLIPImageProcessorPil(size={"shortest_edge": IMAGE_SIZE},
                                          crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    else:
        vision = SiglipVisionConfig(**VISION)
        processor = SiglipImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    cfg = LlavaConfig(vision_config=vision, text_config=LlamaConfig(**TEXT), image_token_id=image_token_id,
                      vision_feature_layer=feature_layer, vision_feature_select_strategy=strategy)
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(cfg)
    sharpen(model, seed)
    model.save_pretrained(str(path), safe_serialization=True)
    processor.save_pretrained(str(path))
    return model.eval()


def noise_image(seed: int, size: tuple[int, int] = (80, 64), mode: str = "RGB") -> Image.Image:
    """A random-noise image (every pixel matters to the features)."""
    rng = np.random.default_rng(seed)
    channels = len(Image.new(mode, (1, 1)).getbands())
    pixels = rng.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8)
    return Image.fromarray(pixels.squeeze(-1) if channels == 1 else pixels, mode)


SMOLVLM_SPECIALS = ["<fake_token_around_image>", "<global-img>", "<end_of_utterance>"] + [
    f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
TILE = 56


def save_smolvlm(path: Path, seed: int = 0, scale_factor: int = 2) -> torch.nn.Module:
    """Builds, sharpens and saves an Idefics3 (SmolVLM) folder whose images split into 56-px tiles of
    (56 / 14)^2 / scale^2 feature rows; returns the transformers model (fp32, eval)."""
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3ImageProcessorPil, LlamaConfig
    from transformers.models.idefics3.configuration_idefics3 import Idefics3VisionConfig

    path.mkdir(parents=True, exist_ok=True)
    tok = byte_tokenizer()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in [IMAGE_TOKEN, *SMOLVLM_SPECIALS]])
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "<end_of_utterance>",
        "add_bos_token": False}))
    vision = Idefics3VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  image_size=TILE, patch_size=PATCH)
    cfg = Idefics3Config(vision_config=vision, text_config=LlamaConfig(**(TEXT | {"vocab_size": 320})),
                         image_token_id=tok.token_to_id(IMAGE_TOKEN), scale_factor=scale_factor)
    torch.manual_seed(seed)
    model = Idefics3ForConditionalGeneration(cfg)
    sharpen(model, seed)
    model.save_pretrained(str(path), safe_serialization=True)
    Idefics3ImageProcessorPil(size={"longest_edge": 2 * TILE}, max_image_size={"longest_edge": TILE}).save_pretrained(
        str(path))
    return model.eval()
