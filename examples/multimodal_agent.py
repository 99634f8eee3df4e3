"""A multimodal agent: it looks at photos, picks a tool for each with `select`, and answers follow-up
questions about the same photo, which the radix cache and the image cache serve without re-encoding.

Run with a downloaded LLaVA folder (e.g. llava-hf/llava-1.5-7b-hf, fetched on a machine with network):
    .venv/bin/python examples/multimodal_agent.py --model path/to/llava-1.5-7b-hf [--image photo.jpg ...]
Without --model it builds a tiny random-weight LLaVA in a temporary folder: then every mechanism runs
for real (preprocessing, vision tower, projector, keyed image hashing, prefix sharing, the embedding
cache), but the generated text is meaningless.
"""
import argparse
import tempfile
from pathlib import Path

from PIL import Image, ImageDraw

import radixlang as rl
from radixlang.testing.random_llava import write_random_llava

TOOLS = ["describe", "count objects", "read text"]


def synthetic_photos() -> list[Image.Image]:
    """Two drawn pictures (no downloads): a red circle on blue, and three yellow squares on green."""
    circle = Image.new("RGB", (320, 240), (30, 60, 200))
    ImageDraw.Draw(circle).ellipse((100, 60, 220, 180), fill=(220, 30, 30))
    squares = Image.new("RGB", (300, 300), (40, 160, 60))
    for x in (30, 120, 210):
        ImageDraw.Draw(squares).rectangle((x, 120, x + 60, 180), fill=(240, 220, 40))
    return [circle, squares]


@rl.function
def inspect(s, photo, questions):
    s += "USER: " + rl.image(photo) + "\nWhich tool fits this photo best? ASSISTANT:"
    s += " " + rl.select("tool", TOOLS) + "\n"
    s += "USER: Use it. ASSISTANT:" + rl.gen("finding", max_tokens=24, stop="\n") + "\n"
    answers = s.fork(len(questions))  # each follow-up shares the photo's prefix in the radix cache
    for fork, question in zip(answers, questions):
        fork += "USER: " + question + " ASSISTANT:" + rl.gen("answer", max_tokens=16, stop="\n")
    return [fork["answer"] for fork in answers]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a LLaVA HF folder; default: a tiny random-weight checkpoint")
    parser.add_argument("--image", action="append", help="an image file (repeatable); default: drawn pictures")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(write_random_llava(Path(tmp) / "random-llava"))
        if args.model is None:
            print("Using a tiny random-weight LLaVA: the text below is meaningless, though every mechanism "
                  "(preprocessing, vision tower, projector, image keys, prefix sharing, image cache) is real.\n")
        photos = args.image or synthetic_photos()
        questions = ["What colour dominates?", "Is there a person?", "Where was it taken?"]
        with rl.Runtime(model, kv_cache_tokens=16384) as runtime:
            encoder = runtime.engine.image_encoder
            for i, photo in enumerate(photos):
                state = inspect.run(photo=photo, questions=questions, backend=runtime, temperature=0)
                print(f"photo {i}: tool = {state['tool']!r}, finding = {state['finding']!r}")
                for question, answer in zip(questions, state.ret_value or []):
                    print(f"  {question} -> {answer!r}")
            print(f"\n{len(photos)} photos, {len(photos) * (2 + len(questions))} calls on them: "
                  f"{encoder.counters.encodes} vision-tower encodes, {encoder.counters.cache_hits} image-cache hits")


if __name__ == "__main__":
    main()
