"""Vision-language HF folders: the language model as our Llama family, plus the vision side."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from PIL import Image

from ..distributed.group import TensorParallel
from ..models.loading.loader import LoadedModel, build_model, read_hf_config, read_hf_dir
from ..tokenizer import Tokenizer
from .idefics3 import (
    IDEFICS3_ARCH,
    Idefics3Config,
    Idefics3Vision,
    SplitImageProcessor,
    make_prepare,
    split_idefics3_weights,
)
from .llava import LLAVA, LlavaConfig, LlavaVision, llava_text_config, split_llava_weights
from .preprocess import ImageProcessor, read_preprocessor_config

VISION_ARCHS = (LLAVA, IDEFICS3_ARCH)


@dataclass(slots=True)
class VisionModel:
    """What an engine needs of a vision-language model besides its language model."""

    module: LlavaVision | Idefics3Vision  # encode(one image's pixels) -> [feature rows, hidden]
    # an image -> (its pixels, the tokens that replace its placeholder: image_token_id at each feature row)
    prepare: Callable[[Image.Image], tuple[torch.Tensor, list[int]]]
    image_token_id: int  # the prompt's placeholder for one image, and the token of each feature row
    placeholder: str  # that token's text


def load_vision_language(path: Path, device: torch.device, dtype: torch.dtype,
                         tp: TensorParallel | None = None) -> LoadedModel:
    """`tp`: this rank's shard of the language model; the vision side only on rank 0, which encodes every
    image (the other ranks receive its embeddings)."""
    hf = read_hf_config(path)
    cfg, weights, tokenizer = read_hf_dir(path, llava_text_config(hf))
    idefics3 = IDEFICS3_ARCH in (hf.get("architectures") or [])
    text_weights, vision_weights = (split_idefics3_weights if idefics3 else split_llava_weights)(weights)
    model = build_model(cfg, text_weights, device, dtype, tp)
    if tp is not None and tp.rank > 0:
        return LoadedModel(model, tokenizer, path.name)
    build = build_idefics3 if idefics3 else build_vision
    vision = build(path, hf, vision_weights, tokenizer, device, dtype)
    return LoadedModel(model, tokenizer, path.name, vision)


def build_vision(path: Path, hf: dict[str, Any], weights, tokenizer: Tokenizer, device: torch.device,
                 dtype: torch.dtype) -> VisionModel:
    cfg = LlavaConfig.from_hf(hf)
    processor = ImageProcessor.from_folder(path)
    if processor.output_size() != (cfg.vision.image_size, cfg.vision.image_size):
        raise ValueError(f"preprocessor_config.json makes {processor.output_size()} images; the vision tower "
                         f"takes {cfg.vision.image_size}x{cfg.vision.image_size}")
    with torch.device("meta"):
        module = LlavaVision(cfg)
    module = module.to_empty(device=device)
    module.load_weights(weights)
    tokens = [cfg.image_token_id] * cfg.tokens_per_image
    return VisionModel(module.to(dtype).eval(), lambda image: (processor(image), tokens), cfg.image_token_id,
                       image_placeholder(tokenizer, cfg.image_token_id))


def build_idefics3(path: Path, hf: dict[str, Any], weights, tokenizer: Tokenizer, device: torch.device,
                   dtype: torch.dtype) -> VisionModel:
    cfg = Idefics3Config.from_hf(hf, llava_text_config(hf)["hidden_size"])
    processor = SplitImageProcessor.from_dict(read_preprocessor_config(path))
    with torch.device("meta"):
        module = Idefics3Vision(cfg)
    module = module.to_empty(device=device)
    module.load_weights(weights)
    placeholder = image_placeholder(tokenizer, cfg.image_token_id)
    prepare = make_prepare(processor, cfg, placeholder, lambda text: tokenizer.encode(text, add_special_tokens=False))
    return VisionModel(module.to(dtype).eval(), prepare, cfg.image_token_id, placeholder)


def image_placeholder(tokenizer: Tokenizer, token_id: int) -> str:
    """The text of the image token, which must tokenize back to that one token."""
    text = tokenizer.decode([token_id], skip_special_tokens=False)
    if not text or tokenizer.encode(text, add_special_tokens=False) != [token_id]:
        raise ValueError(f"the image token id {token_id} is not a token of its own in this tokenizer "
                         f"(it decodes to {text!r})")
    return text

