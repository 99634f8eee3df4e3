"""Runs SGLang's own frontend test programs (`sglang/test/test_programs.py` from the sglang wheel) against a
`radixlang serve` URL, one of two ways, and prints one JSON line per program:

  python -m tests.compat.sglang_programs radixlang URL   # the program file unchanged, `sglang` = radixlang
  python -m tests.compat.sglang_programs sglang URL      # SGLang's own RuntimeEndpoint client

Each program runs in a thread with a time limit, so a client that hangs is reported as "hang", not waited on.
A result is `pass`, `fail` (with the exception's type: an AssertionError is a content check on the model's
answer) or `hang`.

What stands in for SGLang's server side (its `srt` package needs CUDA-era dependencies the frontend does
not): `sglang.srt.utils.is_hip` (False) and `hf_transformers_utils.get_tokenizer`, which loads the served
model's tokenizer with transformers (a GGUF file too), as SGLang's own does.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import sys
import threading
import time
import traceback
import types
from pathlib import Path
from typing import Any, Callable

# the programs that run on a local runtime (test_image_qa needs an image file and a vision model;
# test_completion_speculative measures an OpenAI backend's token_usage)
PROGRAMS = ("test_few_shot_qa", "test_mt_bench", "test_select", "test_decode_int", "test_decode_json_regex",
            "test_decode_json", "test_expert_answer", "test_tool_use", "test_react", "test_parallel_decoding",
            "test_parallel_encoding", "test_stream", "test_stream_logprobs", "test_regex", "test_dtype_gen",
            "test_gen_min_new_tokens")
# num_api_spec_tokens: SGLang's RuntimeEndpoint has no `is_chat_model` (its API speculation is for OpenAI
# backends), so under SGLang's client this program fails inside its worker thread; radixlang accepts it
ONLY_RADIXLANG = ("test_chat_completion_speculative",)
PROGRAM_TIMEOUT_S = 120.0
MAX_NEW_TOKENS_CAP = 32  # run() / gen() defaults of up to 512 tokens: capped to keep the suite fast on a CPU


def programs_file() -> Path:
    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("the sglang wheel is not installed (pip install --no-deps sglang)")
    return Path(spec.origin).parent / "test" / "test_programs.py"


def hf_tokenizer(model_path: str) -> Any:
    """The served model's tokenizer, loaded by transformers (what SGLang's get_tokenizer returns)."""
    from transformers import AutoTokenizer

    path = Path(model_path)
    if path.suffix == ".gguf":
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return AutoTokenizer.from_pretrained(str(path))


def _module(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


def stand_in_srt(package: types.ModuleType | None) -> None:
    """The two names test_programs.py imports from SGLang's server package."""
    srt = _module("sglang.srt")
    utils = _module("sglang.srt.utils", is_hip=lambda: False)
    hf = _module("sglang.srt.utils.hf_transformers_utils", get_tokenizer=hf_tokenizer)
    srt.utils, utils.hf_transformers_utils = utils, hf
    if package is not None:
        package.srt = srt


class Served:
    """SGLang's `Runtime` handle of a server this process did not launch: `.endpoint` is its client
    (test_gen_min_new_tokens reads `global_config.default_backend.endpoint`)."""

    def __init__(self, endpoint: Any):
        self.endpoint = endpoint


def setup_radixlang(url: str) -> types.ModuleType:
    import radixlang
    import radixlang.lang
    import radixlang.lang.ir

    sys.modules["sglang"] = radixlang
    sys.modules["sglang.lang"] = radixlang.lang
    sys.modules["sglang.lang.ir"] = radixlang.lang.ir
    stand_in_srt(None)
    radixlang.set_default_backend(radixlang.RuntimeEndpoint(url))
    return radixlang


def setup_sglang(url: str) -> types.ModuleType:
    import sglang

    stand_in_srt(sglang)
    sglang.set_default_backend(Served(sglang.RuntimeEndpoint(url)))
    return sglang


def load_programs(path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("sglang_test_programs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cap_max_tokens(sgl: types.ModuleType) -> None:
    """Caps max_new_tokens / max_tokens the programs pass (a 512-token summary takes minutes on a CPU)."""
    function = sgl.function

    def capped(kwargs: dict[str, Any], name: str) -> None:
        if kwargs.get(name) is not None:
            kwargs[name] = min(kwargs[name], MAX_NEW_TOKENS_CAP)

    def wrap_function(*args: Any, **kwargs: Any) -> Any:
        program = function(*args, **kwargs)
        if not callable(getattr(program, "run", None)):  # the decorator form: function(num_api_spec_tokens=...)
            return lambda f: _capped_program(program(f), capped)
        return _capped_program(program, capped)

    gen = sgl.gen

    def gen_capped(*args: Any, **kwargs: Any) -> Any:
        cap = max(MAX_NEW_TOKENS_CAP, kwargs.get("min_tokens") or 0)  # test_gen_min_new_tokens asks for 64
        if len(args) > 1 and args[1] is not None:  # gen(name, max_tokens, ...)
            args = (args[0], min(args[1], cap), *args[2:])
        if kwargs.get("max_tokens") is not None:
            kwargs["max_tokens"] = min(kwargs["max_tokens"], cap)
        return gen(*args, **kwargs)

    sgl.function, sgl.gen = wrap_function, gen_capped


def _capped_program(program: Any, capped: Callable[[dict, str], None]) -> Any:
    run, run_batch = program.run, program.run_batch

    def run_capped(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("max_new_tokens", MAX_NEW_TOKENS_CAP)
        capped(kwargs, "max_new_tokens")
        return run(*args, **kwargs)

    def run_batch_capped(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("max_new_tokens", MAX_NEW_TOKENS_CAP)
        capped(kwargs, "max_new_tokens")
        return run_batch(*args, **kwargs)

    program.run, program.run_batch = run_capped, run_batch_capped
    return program


def run_one(fn: Callable[[], Any], timeout: float) -> dict[str, Any]:
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            fn()
            outcome.update(result="pass")
        except BaseException as e:  # noqa: BLE001 - reported, not raised
            where = traceback.extract_tb(e.__traceback__)[-1]
            outcome.update(result="fail", exception=type(e).__name__, detail=str(e)[:300],
                           where=f"{Path(where.filename).name}:{where.lineno}: {where.line}")

    started = time.monotonic()
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return {"result": "hang", "detail": f"no result after {timeout:.0f} s", "seconds": timeout}
    return outcome | {"seconds": round(time.monotonic() - started, 1)}


def main(argv: list[str]) -> int:
    client, url = argv[0], argv[1]
    names = argv[2:] or list(PROGRAMS + (ONLY_RADIXLANG if client == "radixlang" else ()))
    path = programs_file()  # found before `sglang` may be aliased
    sgl = setup_radixlang(url) if client == "radixlang" else setup_sglang(url)
    cap_max_tokens(sgl)
    programs = load_programs(path)
    hung = False
    for name in names:
        fn = getattr(programs, name)
        if name == "test_select":  # SGLang's suite checks the answers too (test_srt_backend)
            fn = functools.partial(fn, check_answer=True)
        out = run_one(fn, PROGRAM_TIMEOUT_S)
        print(json.dumps({"program": name, **out}), flush=True)
        hung = hung or out["result"] == "hang"
    sys.stdout.flush()
    if hung:  # a hung client thread would keep the process alive
        import os

        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
