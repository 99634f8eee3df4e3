"""The systems measured in one run: radixlang engines (radix cache on and off, and extras a workload
asks for) and the plain-LM baselines that could be started (a missing one is skipped, with the reason)."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from radixlang.runtime.engine import Engine
from radixlang.runtime.models.loading.loader import default_model_path

from .plain_lm import LLAMA_CPP_CMAKE_ARGS, LlamaCppLM, PlainLM, TransformersLM

RADIXLANG = "radixlang"
RADIXLANG_NO_CACHE = "radixlang, no radix cache"


@dataclass(slots=True)
class Systems:
    model: str
    device: str
    kv_cache_tokens: int
    engines: dict[str, Engine] = field(default_factory=dict)
    plain: list[PlainLM] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    servers: dict[str, str] = field(default_factory=dict)
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def engine(self, label: str, **options: Any) -> Engine:
        """The engine called `label`, started with `options` on first use."""
        if label not in self.engines:
            self.engines[label] = Engine(model=self.model, device=self.device, kv_cache_tokens=self.kv_cache_tokens,
                                         **options)
        return self.engines[label]

    def server_url(self, label: str) -> str:
        """The URL of an HTTP server (in this process, on a free port) over the engine called `label`."""
        if label not in self.servers:
            from radixlang.server.launch import background_server

            self.servers[label] = self.stack.enter_context(background_server(self.engine(label))).url
        return self.servers[label]

    def close(self) -> None:
        self.stack.close()
        for engine in self.engines.values():
            engine.check_invariants()
            engine.shutdown()


def start_systems(model: str | None, device: str, kv_cache_tokens: int, batch_size: int,
                  baselines: list[str]) -> Systems:
    systems = Systems(str(model or default_model_path()), device, kv_cache_tokens)
    cache_on = systems.engine(RADIXLANG)
    systems.engine(RADIXLANG_NO_CACHE, disable_radix_cache=True)
    tokenizer = cache_on.tokenizer
    if "hf" in baselines:
        try:
            systems.plain.append(TransformersLM(systems.model, tokenizer, batch_size, device))
        except ImportError as e:
            systems.skipped["HF transformers"] = f"not installed ({e}); pip install -e '.[test]'"
    if "llama.cpp" in baselines:
        if not systems.model.endswith(".gguf"):
            systems.skipped["llama.cpp"] = "needs a GGUF model"
        else:
            try:
                systems.plain.append(LlamaCppLM(systems.model, tokenizer, kv_cache_tokens))
            except ImportError:
                systems.skipped["llama.cpp"] = ("llama-cpp-python is not installed (optional; it builds from source "
                                                f"in ~15 min on 2 cores: CMAKE_ARGS='{LLAMA_CPP_CMAKE_ARGS}' "
                                                "pip install llama-cpp-python)")
    return systems


def warm_up(systems: Systems) -> None:
    """One short call per system first, so no measurement pays for thread pools and first allocations."""
    for engine in systems.engines.values():
        engine.generate("Hello", {"temperature": 0, "max_new_tokens": 4})
        engine.flush_cache()
    for lm in systems.plain:
        lm.generate(["Hello"], 4)
        lm.score([("Hello", [" world"])])
        lm.generated_tokens, lm.latencies = 0, []
