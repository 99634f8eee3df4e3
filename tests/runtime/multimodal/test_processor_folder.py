"""A LLaVA folder as transformers 5 saves it with its processor (no preprocessor_config.json: the image
processor sits in processor_config.json, the chat template in chat_template.jinja, a list-content template
as llava-hf's), served over the OpenAI API (chat and responses) and Anthropic's messages API, driven with
their SDKs, against transformers."""
from __future__ import annotations

import base64
import io
import json

import pytest
import torch

from radixlang.runtime.multimodal.preprocess import read_preprocessor_config

from ...server.conftest import serving
from .llava_tiny import IMAGE_SIZE, IMAGE_TOKEN, noise_image, save_llava

transformers = pytest.importorskip("transformers")
openai = pytest.importorskip("openai", reason="the openai SDK is the peer client of this test")
anthropic = pytest.importorskip("anthropic", reason="the anthropic SDK is the peer client of /v1/messages")

# content parts in order, each image where it stands (as llava-hf's interleaved templates render them)
PARTS_TEMPLATE = ("{% for m in messages %}{{ m['role'].upper() }}: {% for c in m['content'] %}"
                  "{% if c['type'] == 'image' %}<image>{% else %}{{ c['text'] }}{% endif %}{% endfor %}\n"
                  "{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}")
A, B = noise_image(61), noise_image(62, (40, 90))


@pytest.fixture(scope="module")
def processor_llava(tmp_path_factory):
    """(folder, transformers model, transformers processor) of a LLaVA saved with a LlavaProcessor."""
    path = tmp_path_factory.mktemp("llava5") / "clip"
    model = save_llava(path, seed=5)
    image_processor = transformers.AutoImageProcessor.from_pretrained(str(path))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    (path / "preprocessor_config.json").unlink()
    config = json.loads((path / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    processor = transformers.LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=14,
                                            vision_feature_select_strategy="default", image_token=IMAGE_TOKEN,
                                            num_additional_image_tokens=1,
                                            chat_template=PARTS_TEMPLATE)
    processor.save_pretrained(str(path))
    return path, model, transformers.AutoProcessor.from_pretrained(str(path))


def test_transformers_5_saves_the_image_processor_and_template_where_we_read_them(processor_llava):
    path, _, processor = processor_llava
    assert not (path / "preprocessor_config.json").exists()
    assert (path / "chat_template.jinja").read_text() == PARTS_TEMPLATE
    assert read_preprocessor_config(path)["crop_size"] == {"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    assert processor.chat_template == PARTS_TEMPLATE


def test_a_folder_with_neither_processor_file_is_refused(tmp_path):
    (tmp_path / "processor_config.json").write_text(json.dumps({"processor_class": "LlavaProcessor"}))
    with pytest.raises(ValueError, match="image_processor entry in processor_config.json"):
        read_preprocessor_config(tmp_path)


def data_url(image) -> str:
    out = io.BytesIO()
    image.save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def image_block(image) -> dict:
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                        "data": data_url(image).split(",", 1)[1]}}


def transformers_run(model, processor, messages: list[dict], images) -> tuple[list[int], list[int]]:
    """(the expanded prompt's ids, greedy tokens) as transformers' processor and model give them."""
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    inputs = processor(images=images, text=text, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=6, do_sample=False)
    ids = inputs["input_ids"][0].tolist()
    return ids, out[0, len(ids):].tolist()


def test_openai_chat_with_image_parts_equals_generate_and_transformers(processor_llava):
    path, model, processor = processor_llava
    hf_messages = [{"role": "user", "content": [{"type": "text", "text": "compare "}, {"type": "image"},
                                                {"type": "text", "text": " with "}, {"type": "image"},
                                                {"type": "text", "text": "?"}]}]
    want_prompt, want_tokens = transformers_run(model, processor, hf_messages, [A, B])
    sdk_content = [{"type": "text", "text": "compare "}, {"type": "image_url", "image_url": {"url": data_url(A)}},
                   {"type": "text", "text": " with "}, {"type": "image_url", "image_url": {"url": data_url(B)}},
                   {"type": "text", "text": "?"}]
    with serving(path) as live:
        client = openai.OpenAI(base_url=live.url + "/v1", api_key="none")
        chats = [client.chat.completions.create(model=live.engine.model_name, max_tokens=6, temperature=0,
                                                messages=[{"role": "user", "content": sdk_content}])
                 for _ in range(2)]
        # the agent protocols' image parts: an input_image (Responses) and a base64 image block (Messages)
        response = client.responses.create(model=live.engine.model_name, max_output_tokens=6, temperature=0,
                                           store=False, input=[{"role": "user", "content": [
                                               {"type": "input_text", "text": "compare "},
                                               {"type": "input_image", "image_url": data_url(A)},
                                               {"type": "input_text", "text": " with "},
                                               {"type": "input_image", "image_url": data_url(B)},
                                               {"type": "input_text", "text": "?"}]}])
        blocks = [{"type": "text", "text": "compare "}, image_block(A), {"type": "text", "text": " with "},
                  image_block(B), {"type": "text", "text": "?"}]
        with anthropic.Anthropic(base_url=live.url, api_key="unused", max_retries=0) as claude:
            message = claude.messages.create(model=live.engine.model_name, max_tokens=6,
                                             extra_body={"temperature": 0},
                                             messages=[{"role": "user", "content": blocks}])
        text = processor.apply_chat_template(hf_messages, add_generation_prompt=True)
        with live.client() as http:
            native = http.post("/generate", json={"text": text, "image_data": [data_url(A), data_url(B)],
                                                  "sampling_params": {"max_new_tokens": 6, "temperature": 0}})
        live.wait_idle()
    assert native.status_code == 200, native.text
    assert native.json()["output_ids"] == want_tokens
    assert native.json()["meta_info"]["prompt_tokens"] == len(want_prompt)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    for chat in chats:
        assert chat.choices[0].message.content == tokenizer.decode(want_tokens, skip_special_tokens=True)
        assert chat.usage.prompt_tokens == len(want_prompt)
        cached = chat.usage.prompt_tokens_details.cached_tokens if chat.usage.prompt_tokens_details else 0
        assert 0 <= (cached or 0) <= chat.usage.prompt_tokens
    assert chats[1].usage.prompt_tokens_details.cached_tokens == len(want_prompt) - 1
    assert response.usage.input_tokens == len(want_prompt)
    assert response.output_text == tokenizer.decode(want_tokens, skip_special_tokens=True)
    usage = message.usage  # Anthropic's input_tokens leave out what the cache read
    assert usage.input_tokens + (usage.cache_read_input_tokens or 0) == len(want_prompt)
    assert "".join(b.text for b in message.content if b.type == "text") == \
        tokenizer.decode(want_tokens, skip_special_tokens=True)
