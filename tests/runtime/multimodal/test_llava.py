"""LLaVA against transformers on the same tiny random-weight checkpoints and images: pixel values,
image features, logits (as logprobs) and greedy tokens; then the image cache and the radix keys."""
from __future__ import annotations

import io

import pytest
import torch

from radixlang.runtime.engine import Engine
from radixlang.runtime.multimodal.identity import IMAGE_KEY_BASE
from radixlang.runtime.multimodal.preprocess import ImageProcessor

from .llava_tiny import GREEDY, IMAGE_SIZE, PATCH, PROMPT, noise_image, save_llava

transformers = pytest.importorskip("transformers")


def hf_pixels(path, images):
    processor = transformers.AutoImageProcessor.from_pretrained(str(path))
    assert processor.backend == "pil", "the PIL processor: no torchvision here"
    return processor(images=images, return_tensors="pt")["pixel_values"]


def hf_ids(path, model, text: str) -> list[int]:
    """transformers' tokens for `text`, each image token repeated as LLaVA's processor does."""
    ids = transformers.AutoTokenizer.from_pretrained(str(path))(text)["input_ids"]
    n = (IMAGE_SIZE // PATCH) ** 2
    return [x for t in ids for x in ([t] * n if t == model.config.image_token_id else [t])]


@pytest.mark.parametrize("tower", ["clip", "siglip"])
def test_pixel_values_match_transformers_pil_processor(tmp_path, tower):
    path = tmp_path / tower
    save_llava(path, tower=tower, strategy="default" if tower == "clip" else "full", feature_layer=-1)
    images = [noise_image(1, (80, 64)), noise_image(2, (30, 90), "RGBA"), noise_image(3, (20, 20), "L"),
              noise_image(4, (57, 200), "P")]
    ours = torch.stack([ImageProcessor.from_folder(path)(im) for im in images])
    torch.testing.assert_close(ours, hf_pixels(path, images), rtol=0, atol=1e-6)


@pytest.mark.parametrize("tower,layer,strategy", [("clip", -2, "default"), ("clip", [-3, -1], "full"),
                                                  ("siglip", -1, "full"), ("siglip", 1, "full")])
def test_image_features_match_transformers(tmp_path, tower, layer, strategy):
    path = tmp_path / tower
    model = save_llava(path, tower=tower, feature_layer=layer, strategy=strategy, seed=3)
    images = [noise_image(5), noise_image(6, (64, 64))]
    pixels = hf_pixels(path, images)
    with torch.no_grad():
        want = model.model.get_image_features(pixel_values=pixels).pooler_output
    with Engine(str(path), kv_cache_tokens=256) as engine:
        got = torch.stack([engine.image_encoder.embed(i, p) for i, p in enumerate(pixels)])
        engine.check_invariants()
    want = torch.stack(list(want))
    scale = want.abs().max().item()  # sharpened weights make large features: float noise scales with them
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * scale)


def test_logits_and_greedy_tokens_match_transformers_with_two_images(clip_llava, engine):
    path, model = clip_llava
    images = [noise_image(7), noise_image(8, (50, 70), "RGBA")]
    text = "USER: <image> and <image>\nSame? ASSISTANT:"
    out = engine.generate(text, GREEDY, image_data=images, return_logprob=True, top_logprobs_num=3)
    ids = hf_ids(path, model, text)
    with torch.no_grad():
        generated = model.generate(input_ids=torch.tensor([ids]), pixel_values=hf_pixels(path, images),
                                   max_new_tokens=6, do_sample=False)
        full = torch.cat([torch.tensor(ids), generated[0, len(ids):]])
        logits = model(input_ids=full[None, :-1], pixel_values=hf_pixels(path, images)).logits[0]
    assert out.output_ids == generated[0, len(ids):].tolist()
    assert out.meta.prompt_tokens == len(ids)
    want = torch.log_softmax(logits[len(ids) - 1:].float(), -1)
    for step, lp in enumerate(out.meta.output_logprobs):
        assert lp.logprob == pytest.approx(want[step, lp.token_id].item(), rel=2e-5, abs=1e-4)
        top = torch.topk(want[step], 3)
        assert [t for t, _ in lp.top] == top.indices.tolist()
        assert [v for _, v in lp.top] == pytest.approx(top.values.tolist(), rel=2e-5, abs=1e-4)
    engine.check_invariants()


def test_a_repeated_image_is_encoded_once_and_its_span_counts_as_cached(engine):
    image = noise_image(11)
    before = engine.image_encoder.counters.encodes
    first = engine.generate(PROMPT, GREEDY, image_data=[image])
    second = engine.generate(PROMPT.replace("What is it?", "Which color?"), GREEDY, image_data=[image])
    span_end = PROMPT.index("<image>") + (IMAGE_SIZE // PATCH) ** 2  # one token per byte before it
    assert engine.image_encoder.counters.encodes == before + 1
    assert first.meta.cached_tokens < span_end <= second.meta.cached_tokens
    # evicted from the radix tree, the span is prefilled again from the embedding cache, not re-encoded
    assert engine.flush_cache()
    hits = engine.image_encoder.counters.cache_hits
    third = engine.generate(PROMPT, GREEDY, image_data=[image])
    assert third.output_ids == first.output_ids and third.meta.cached_tokens == 0
    assert engine.image_encoder.counters.encodes == before + 1
    assert engine.image_encoder.counters.cache_hits == hits + 1
    engine.check_invariants()


def test_the_same_pixels_in_another_file_format_are_the_same_image(engine):
    image = noise_image(12)
    png, bmp = io.BytesIO(), io.BytesIO()
    image.save(png, "PNG")
    image.save(bmp, "BMP")
    before = engine.image_encoder.counters.encodes
    a = engine.generate(PROMPT, GREEDY, image_data=[png.getvalue()])
    b = engine.generate(PROMPT, GREEDY, image_data=[bmp.getvalue()])
    assert engine.image_encoder.counters.encodes == before + 1 and a.output_ids == b.output_ids
    assert b.meta.cached_tokens == b.meta.prompt_tokens - 1
    engine.check_invariants()


def test_different_images_never_share_a_prefix(engine):
    prefix = PROMPT.index("<image>")
    a = engine.generate(PROMPT, GREEDY, image_data=[noise_image(21)])
    b = engine.generate(PROMPT, GREEDY, image_data=[noise_image(22)])
    assert a.meta.cached_tokens <= prefix and b.meta.cached_tokens == prefix  # the text before the image only
    # the tree's edges hold each image's full 128-bit key, and the two keys differ at the span's first key
    keys = {k for node in engine.scheduler.kv.cache.nodes() for k in node.key if k >= IMAGE_KEY_BASE}
    assert len(keys) >= 2 and all(k - IMAGE_KEY_BASE < 1 << 128 for k in keys)
    engine.check_invariants()


def test_image_keys_are_secret_per_engine(clip_llava, engine):
    image = noise_image(31)
    with Engine(str(clip_llava[0]), kv_cache_tokens=256) as other:
        assert other.image_prompts.keyer.key(image) != engine.image_prompts.keyer.key(image)
        other.check_invariants()
    assert engine.image_prompts.keyer.key(image) == engine.image_prompts.keyer.key(image.copy())


def test_prompt_logprobs_score_text_after_the_images_only(engine):
    image = noise_image(41)
    ids = engine.tokenizer.encode(PROMPT)
    start = PROMPT.index("<image>") + 1
    out = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 0}, image_data=[image],
                          return_logprob=True, logprob_start_len=start)
    assert [lp.token_id for lp in out.meta.input_logprobs] == ids[start:]
    with pytest.raises(ValueError, match="would score image tokens"):
        engine.generate(input_ids=ids, sampling_params=GREEDY, image_data=[image], return_logprob=True,
                        logprob_start_len=start - 1)
    engine.check_invariants()


def test_the_random_checkpoint_writer_makes_a_folder_transformers_reads_the_same(tmp_path):
    from radixlang.testing.random_llava import RandomLlavaSize, write_random_llava

    path = write_random_llava(tmp_path / "random", RandomLlavaSize(64, 2, 28, 14, 32, 2), seed=5)
    model = transformers.LlavaForConditionalGeneration.from_pretrained(str(path), dtype=torch.float32).eval()
    image = noise_image(61)
    text = "USER: <image>\nHi ASSISTANT:"
    ids = [x for t in transformers.AutoTokenizer.from_pretrained(str(path))(text)["input_ids"]
           for x in ([t] * 4 if t == model.config.image_token_id else [t])]
    with torch.no_grad():
        want = model.generate(input_ids=torch.tensor([ids]), pixel_values=hf_pixels(path, [image]),
                              max_new_tokens=6, do_sample=False)[0, len(ids):].tolist()
    with Engine(str(path), kv_cache_tokens=256) as engine:
        assert engine.generate(text, GREEDY, image_data=[image]).output_ids == want
        engine.check_invariants()


def test_sparse_configs_take_transformers_defaults():
    """Real folders (llava-1.5-7b-hf) leave out the fields whose value is transformers' default."""
    from radixlang.runtime.multimodal.llava import LlavaConfig, llava_text_config

    hf = {"text_config": {"model_type": "llama", "vocab_size": 32064, "max_position_embeddings": 4096},
          "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024, "image_size": 336,
                            "intermediate_size": 4096, "num_attention_heads": 16, "num_hidden_layers": 24,
                            "patch_size": 14}}
    want = transformers.LlavaConfig(**hf)
    ours = LlavaConfig.from_hf(hf)
    text = llava_text_config(hf)
    for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "max_position_embeddings", "rms_norm_eps"):
        assert text[field] == getattr(want.text_config, field), field
    v = want.vision_config
    assert (ours.vision.hidden_size, ours.vision.layer_norm_eps, ours.vision.hidden_act, ours.tokens_per_image,
            ours.image_token_id) == (v.hidden_size, v.layer_norm_eps, v.hidden_act, 576, want.image_token_id)
    assert LlavaConfig.from_hf({"text_config": {}}).vision == LlavaConfig.from_hf(hf).vision
