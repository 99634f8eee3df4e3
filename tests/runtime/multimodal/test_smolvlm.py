"""SmolVLM (Idefics3) against transformers on a tiny random-weight checkpoint: the expanded prompt (tile
markers and feature rows), pixel values of split images, image features, logprobs and greedy tokens."""
from __future__ import annotations

import pytest
import torch

from radixlang.runtime.engine import Engine
from radixlang.runtime.multimodal.identity import is_image_key

from .llava_tiny import noise_image, save_smolvlm

transformers = pytest.importorskip("transformers")
TEXT = "User:<image>and<image>Same?<end_of_utterance>\nAssistant:"
# a 2x2 split plus the global view, no split (one tile), and a 1x2 split
IMAGES = [noise_image(71, (100, 90)), noise_image(72, (40, 30), "RGBA"), noise_image(73, (120, 50))]


@pytest.fixture(scope="module")
def smolvlm(tmp_path_factory):
    path = tmp_path_factory.mktemp("smolvlm") / "tiny"
    model = save_smolvlm(path)
    with Engine(str(path), kv_cache_tokens=2048) as engine:
        yield path, model, engine


def hf_inputs(path, text: str, images) -> dict:
    processor = transformers.Idefics3Processor(
        image_processor=transformers.AutoImageProcessor.from_pretrained(str(path)),
        tokenizer=transformers.AutoTokenizer.from_pretrained(str(path)), image_seq_len=4)
    assert processor.image_processor.backend == "pil"
    return processor(text=text, images=[images], return_tensors="pt")


@pytest.mark.parametrize("images", [IMAGES[:2], IMAGES[1:]])
def test_prompt_expansion_and_pixel_values_match_transformers(smolvlm, images):
    path, _, engine = smolvlm
    want = hf_inputs(path, TEXT, images)
    prompts = engine.image_prompts
    ids, spans, _ = prompts.expand(engine.tokenizer.encode(TEXT), images)
    assert [prompts.vision.image_token_id if is_image_key(t) else t for t in ids] == want["input_ids"][0].tolist()
    pixels = torch.cat([prompts.prepare(im).pixels for im in images])
    torch.testing.assert_close(pixels, want["pixel_values"][0], rtol=0, atol=1e-6)
    assert sum(s.length for s in spans) == 4 * len(pixels)  # 4 feature rows per tile


def test_image_features_match_transformers(smolvlm):
    path, model, engine = smolvlm
    want = hf_inputs(path, TEXT, IMAGES[:2])
    with torch.no_grad():
        features = model.model.get_image_features(pixel_values=want["pixel_values"],
                                                  pixel_attention_mask=want["pixel_attention_mask"]).pooler_output[0]
    ours = torch.cat([engine.image_encoder.vision.encode(engine.image_prompts.prepare(im).pixels) for im in IMAGES[:2]])
    torch.testing.assert_close(ours, features, rtol=1e-4, atol=1e-5 * features.abs().max().item())


def test_logprobs_and_greedy_tokens_match_transformers(smolvlm):
    path, model, engine = smolvlm
    images = [IMAGES[0], IMAGES[2]]
    inputs = hf_inputs(path, TEXT, images)
    with torch.no_grad():
        generated = model.generate(**inputs, max_new_tokens=6, do_sample=False)[0, inputs["input_ids"].shape[1]:]
        full = torch.cat([inputs["input_ids"][0], generated])
        logits = model(input_ids=full[None, :-1], pixel_values=inputs["pixel_values"],
                       pixel_attention_mask=inputs["pixel_attention_mask"]).logits[0]
    out = engine.generate(TEXT, {"max_new_tokens": 6, "temperature": 0}, image_data=images, return_logprob=True)
    assert out.output_ids == generated.tolist()
    want = torch.log_softmax(logits[inputs["input_ids"].shape[1] - 1:].float(), -1)
    for step, lp in enumerate(out.meta.output_logprobs):
        assert lp.logprob == pytest.approx(want[step, lp.token_id].item(), rel=2e-5, abs=1e-4)
    # the same images again: no encode, the whole prompt but its last token from the radix cache
    encodes = engine.image_encoder.counters.encodes
    again = engine.generate(TEXT, {"max_new_tokens": 6, "temperature": 0}, image_data=images)
    assert again.output_ids == out.output_ids and engine.image_encoder.counters.encodes == encodes
    assert again.meta.cached_tokens == again.meta.prompt_tokens - 1
    engine.check_invariants()


def test_a_program_with_images_runs_on_smolvlm_and_different_images_share_only_the_markers(smolvlm):
    import radixlang as rl

    _, _, engine = smolvlm

    @rl.function
    def ask(s, first, second):
        s += "User:" + rl.image(first) + "and" + rl.image(second) + "Same?<end_of_utterance>\nAssistant:"
        s += rl.gen("answer", max_tokens=5)

    state = ask.run(first=IMAGES[0], second=IMAGES[2], backend=engine, temperature=0)
    assert state["answer"] == engine.generate(TEXT, {"max_new_tokens": 5, "temperature": 0},
                                              image_data=[IMAGES[0], IMAGES[2]]).text
    prefix = len(engine.tokenizer.encode("User:<fake_token_around_image><row_1_col_1>"))
    other = engine.generate(TEXT, {"max_new_tokens": 1}, image_data=[noise_image(74, (100, 90)), IMAGES[2]])
    assert other.meta.cached_tokens == prefix  # the same 2x2 grid's first marker, then the images differ
    engine.check_invariants()
