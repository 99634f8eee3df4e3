"""Shared fixtures: the real tokenizer, a tiny random-weight model folder that uses it, engines."""
from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import torch

# `tests.…` imports (shared helpers) resolve to this folder without the repo root on sys.path: the root there
# makes our kernels/ shadow the `kernels` distribution transformers >= 5.25 imports (the Makefile runs pytest's
# script for that reason), and pytest's importlib mode registers `tests` only once some test under it is collected
if "tests" not in sys.modules:
    _spec = importlib.util.spec_from_file_location("tests", Path(__file__).with_name("__init__.py"),
                                                   submodule_search_locations=[str(Path(__file__).parent)])
    assert _spec is not None and _spec.loader is not None
    sys.modules["tests"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["tests"])

if not torch.cuda.is_available():  # Triton kernels run in its interpreter on a CPU-only machine (CI)
    os.environ.setdefault("TRITON_INTERPRET", "1")
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:  # `make test-fast` runs one worker per core: give each its share,
    # so that torch's threads do not oversubscribe the cores (spinning OpenMP threads would then wait on each other)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
# the native block kernel (kernels/cpu/block_kernel.py) is built once per machine into the user's cache folder,
# not the session's, and loaded before any test: every test then sees the same low-bit linears (BlockLinear where
# the CPU and compiler allow, else int4pack), not a switch when a background build lands mid-session
_USER_CACHE = os.environ.get("RADIXLANG_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "radixlang"
os.environ.setdefault("RADIXLANG_KERNEL_DIR", str(Path(_USER_CACHE) / "kernels"))
if "RADIXLANG_CACHE_DIR" not in os.environ:  # converted weights go to a folder of this session, not ~/.cache
    os.environ["RADIXLANG_CACHE_DIR"] = tempfile.mkdtemp(prefix="radixlang-test-cache-")
    atexit.register(shutil.rmtree, os.environ["RADIXLANG_CACHE_DIR"], ignore_errors=True)
    # unbounded: the session's folder goes at its end, and its tests load the real model in several layouts, each
    # converted once (the default bound, two entries' worth per model, would evict and convert them again)
    os.environ.setdefault("RADIXLANG_CACHE_MAX_BYTES", str(2**50))

from radixlang.kernels.cpu import block_kernel
from radixlang.runtime.models.loading.loader import default_model_path, gguf_metadata
from radixlang.runtime.tokenizer import Tokenizer
from radixlang.testing.random_llama import TINY_CONFIG, tiny_weights, write_hf_folder  # noqa: F401 (tests import them from here)

block_kernel.available(wait=True)

# `make test-fast` leaves these out (-m "not slow"): the real model (tests/e2e, the smollm_engine fixture),
# the Triton interpreter and compile check, process groups and subprocesses, transformers parity, the
# benchmark scripts
SLOW_PATHS = (
    "tests/e2e/", "tests/kernels/test_compile_check.py", "tests/kernels/test_triton.py",
    "tests/kernels/test_triton_engine.py", "tests/runtime/distributed/", "tests/runtime/multimodal/test_tensor_parallel.py",
    "tests/runtime/multimodal/test_example.py", "tests/runtime/models/test_hf_parity.py", "tests/benchmark/",
    "tests/server/test_cli_serve.py", "tests/server/test_cli_generate.py", "tests/server/test_fuzz.py",
    "tests/compat/",  # SGLang's programs on the real model
    "tests/runtime/models/test_background_compile.py",  # an inductor compile
    "tests/runtime/models/test_moe_parity.py",  # transformers parity, as test_hf_parity
    "tests/runtime/models/test_moe_gguf.py",  # transformers parity of MoE GGUF files
    "tests/server/test_router.py",  # router and worker processes
    "tests/runtime/speculative/test_distribution.py",  # sampling statistics: thousands of draws per case
    "tests/test_main.py",  # `python -m radixlang` in subprocesses, as the CLI tests
)


def _runs_triton(item: pytest.Item) -> bool:
    """A case parametrized onto the Triton backend (it runs in the interpreter on CPU)."""
    callspec = getattr(item, "callspec", None)
    return callspec is not None and "triton" in map(str, callspec.params.values())


def pytest_collection_modifyitems(config, items):
    root = Path(str(config.rootpath))
    for item in items:
        path = Path(str(item.path)).relative_to(root).as_posix()
        if (path.startswith(SLOW_PATHS) or item.get_closest_marker("e2e") or _runs_triton(item)
                or "smollm_engine" in getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


# SGLang's "character generator" regex: Unicode [\w\d\s]{1,16} fields in a JSON-like template
CHARACTER_REGEX = (
    r"""\{\n"""
    + r"""    "name": "[\w\d\s]{1,16}",\n"""
    + r"""    "house": "(Gryffindor|Slytherin|Ravenclaw|Hufflepuff)",\n"""
    + r"""    "blood status": "(Pure-blood|Half-blood|Muggle-born)",\n"""
    + r"""    "occupation": "(student|teacher|auror|ministry of magic|death eater|order of the phoenix)",\n"""
    + r"""    "wand": \{\n"""
    + r"""        "wood": "[\w\d\s]{1,16}",\n"""
    + r"""        "core": "[\w\d\s]{1,16}",\n"""
    + r"""        "length": [0-9]{1,2}\.[0-9]{0,2}\n"""
    + r"""    \},\n"""
    + r"""    "alive": "(Alive|Deceased)",\n"""
    + r"""    "patronus": "[\w\d\s]{1,16}",\n"""
    + r"""    "bogart": "[\w\d\s]{1,16}"\n"""
    + r"""\}"""
)


@pytest.fixture(scope="session")
def smollm_metadata() -> dict:

    return gguf_metadata(default_model_path())


@pytest.fixture(scope="session")
def tokenizer(smollm_metadata) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(smollm_metadata)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer) -> Path:
    """A 2-layer random Llama with SmolLM2's real tokenizer, as an HF folder."""
    path = tmp_path_factory.mktemp("tiny-llama")
    return write_hf_folder(path, TINY_CONFIG, tiny_weights(TINY_CONFIG), tokenizer)


# Longer than any drain test's grace period lets run: the tiny model makes ~400 tokens/s on a 2-core CPU,
# so 1000 tokens could finish inside a 2 s grace on a faster machine, and the request was not aborted.
OUTLASTS_GRACE_TOKENS = 16000
OUTLASTS_GRACE_KV_TOKENS = OUTLASTS_GRACE_TOKENS + 4096  # that request's KV, and room for the others beside it


# A child process's script starts with this to hold its background compile inside torch's C++ (the dispatcher
# calling back into Python, as the compiler's tracing does for seconds at a time) until it is cancelled: where a
# thread left at interpreter exit aborts the process. It returns to Python every 10 ms, where a cancel lands.
STALL_THE_COMPILE = """
import threading, time
from torch._subclasses.fake_tensor import FakeTensorMode

STALLED = threading.Event()
_dispatch = FakeTensorMode.__torch_dispatch__


def _stalling_dispatch(*args, **kwargs):
    if threading.current_thread().name == "radixlang-compile":
        STALLED.set()
        while True:
            time.sleep(0.01)
    return _dispatch(*args, **kwargs)


FakeTensorMode.__torch_dispatch__ = _stalling_dispatch
"""


@pytest.fixture(scope="session")
def lora_adapters(tmp_path_factory, tiny_model_dir) -> dict[str, Path]:
    """Three random PEFT LoRA adapters of the tiny model, every target module (tests/lora_peft.py)."""
    from tests.lora_peft import write_adapters

    return write_adapters(tiny_model_dir, tmp_path_factory.mktemp("lora"))


@pytest.fixture(scope="session")
def long_tiny_model_dir(tmp_path_factory, tokenizer) -> Path:
    """The tiny model with a context long enough for a request of OUTLASTS_GRACE_TOKENS."""
    path = tmp_path_factory.mktemp("tiny-llama-long")
    config = TINY_CONFIG | {"max_position_embeddings": OUTLASTS_GRACE_TOKENS + 384}
    return write_hf_folder(path, config, tiny_weights(config), tokenizer)


@pytest.fixture
def tiny_engine_factory(tiny_model_dir):
    """Builds engines on the tiny model (or `model=`); each is checked for leaked KV and shut down afterwards."""
    from radixlang.runtime.engine import Engine

    engines = []

    def make(**options) -> Engine:
        options.setdefault("kv_cache_tokens", 4096)
        options.setdefault("device", "cpu")
        engine = Engine(**{"model": str(tiny_model_dir)} | options)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.check_invariants()
        engine.shutdown()


@pytest.fixture(scope="session")
def smollm_engine():
    """The real SmolLM2-135M-Instruct, shared by the end-to-end tests."""
    from radixlang.runtime.engine import Engine

    engine = Engine(device="cpu", kv_cache_tokens=16384, quantization="none")  # the exact path
    yield engine
    engine.check_invariants()
    engine.shutdown()
