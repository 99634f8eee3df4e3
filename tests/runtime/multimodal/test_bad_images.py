"""Bad images get a ValueError naming the problem, and the engine stays healthy."""
from __future__ import annotations

import base64
import io
import struct
import zlib

import pytest

from radixlang.runtime.engine import Engine
from radixlang.runtime.multimodal.config import MAX_IMAGE_PIXELS
from radixlang.runtime.multimodal.inputs import load_pil

from .llava_tiny import GREEDY, PROMPT, noise_image


def png_bytes(image) -> bytes:
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def png_claiming(width: int, height: int) -> bytes:
    """A valid small PNG whose header claims width x height pixels (a decompression bomb's shape)."""
    data = bytearray(png_bytes(noise_image(1, (8, 8))))
    ihdr = 8  # after the signature: length, b"IHDR", 13 bytes of fields, crc
    data[ihdr + 8:ihdr + 16] = struct.pack(">II", width, height)
    crc = zlib.crc32(bytes(data[ihdr + 4:ihdr + 21]))
    data[ihdr + 21:ihdr + 25] = struct.pack(">I", crc)
    return bytes(data)


@pytest.mark.parametrize("source,message", [
    (png_bytes(noise_image(2))[:60], "truncated or corrupt"),
    (b"definitely not an image", "not an image"),
    (b"", "is empty"),
    (png_claiming(10_000, 10_000), f"over the {MAX_IMAGE_PIXELS} pixels"),
    (png_claiming(20_000, 20_000), f"over the {MAX_IMAGE_PIXELS} pixels"),  # past Pillow's own limit too
    ("data:image/png;base64,@@@", "neither a base64 data URL"),
    ("data:image/png,rawtext", "without ';base64,'"),
    ("https://example.com/cat.png", "does not exist"),
    ("/no/such/image.png", "does not exist"),
])
def test_bad_sources_are_refused_with_the_reason(source, message):
    with pytest.raises(ValueError, match=message):
        load_pil(source, "image_data[0]")


def test_http_clients_cannot_name_files_or_urls():
    with pytest.raises(ValueError, match="http"):
        load_pil("https://example.com/cat.png", "image", allow_paths=False)
    with pytest.raises(ValueError, match="base64"):
        load_pil("/etc/passwd", "image", allow_paths=False)


def test_every_kind_of_source_decodes_to_the_same_pixels(tmp_path):
    image = noise_image(3)
    raw = png_bytes(image)
    file = tmp_path / "x.png"
    file.write_bytes(raw)
    url = "data:image/png;base64," + base64.b64encode(raw).decode()
    for source in (image, raw, file, str(file), url):
        assert load_pil(source, "image").tobytes() == image.tobytes()
    for source in (url, base64.b64encode(raw).decode()):  # what an HTTP client may send
        assert load_pil(source, "image", allow_paths=False).tobytes() == image.tobytes()


def test_bad_images_leave_the_engine_healthy(engine):
    for source in (png_bytes(noise_image(4))[:80], b"GIF89a junk", png_claiming(10_000, 10_000)):
        with pytest.raises(ValueError, match=r"image_data\[0\]"):
            engine.generate(PROMPT, GREEDY, image_data=[source])
    with pytest.raises(ValueError, match="1 image placeholder.*2 image"):
        engine.generate(PROMPT, GREEDY, image_data=[noise_image(5), noise_image(6)])
    with pytest.raises(ValueError, match="one list of images per prompt"):
        engine.generate([PROMPT, PROMPT], GREEDY, image_data=[noise_image(5)])
    assert engine.generate(PROMPT, GREEDY, image_data=[noise_image(5)]).meta.finish_reason == "length"
    engine.check_invariants()


def test_a_model_without_a_vision_tower_refuses_images(tiny_model_dir):
    with Engine(str(tiny_model_dir), kv_cache_tokens=256) as engine:
        with pytest.raises(ValueError, match="no vision tower"):
            engine.generate("hi", GREEDY, image_data=[noise_image(7)])
        assert engine.generate("hi", {"max_new_tokens": 2}).meta.completion_tokens == 2
        engine.check_invariants()
