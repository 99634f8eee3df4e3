"""The in-process backend: programs call an `Engine` directly."""
from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any, Generator

from ..runtime.meta_info import meta_info
from ..runtime.namespace import DEFAULT_NAMESPACE, Namespace
from .backend import PREFILL_ONLY, GenDelta, StateView, reject_images
from .chat import ChatTemplate
from .choices import ChoiceMethod, common_prefix_len, decide, resolve_method
from .ir import Gen

if TYPE_CHECKING:
    from ..runtime.engine import Engine
    from ..runtime.execution.sampler import TokenLogprob
    from ..runtime.submission import Retention


class EngineBackend:
    def __init__(self, engine: "Engine", namespace: Namespace = DEFAULT_NAMESPACE):
        self.engine = engine
        self.namespace = namespace  # the cache namespace of every request (a server's tenant)

    # ---- Backend protocol -----------------------------------------------------------------------
    def chat_template(self) -> ChatTemplate | None:
        tok = self.engine.tokenizer
        return ChatTemplate(tok.apply_chat_template) if tok.chat_template else None

    def cache_prefix(self, text: str) -> None:
        if text:
            self.engine.generate(text, PREFILL_ONLY, namespace=self.namespace)

    def flush_cache(self) -> bool:
        return self.engine.flush_cache()

    def release_program(self, group: str) -> None:
        """A run ended (completed, failed or cancelled): its states' KV is no longer pinned."""
        self.engine.release_pins(group)

    # ---- SGLang's Runtime names --------------------------------------------------------------------
    @property
    def endpoint(self) -> "EngineBackend":
        """SGLang reads `backend.endpoint` of a Runtime; here the backend is its own."""
        return self

    def get_server_info(self) -> dict[str, Any]:
        """The engine's configuration and its scheduler's live counters."""
        return {**dataclasses.asdict(self.engine.config), "internal_states": [self.engine.stats()]}

    def get_model_name(self) -> str:
        """The model's path: the one given, else the default model's GGUF file."""
        return self.engine.model_path

    def generate(self, state: StateView, gen: Gen) -> Generator[GenDelta, None, None]:
        text, images = self._prompt(state)
        if not text:
            raise ValueError(f"gen {gen.name!r} has no text before it to condition on")
        p = gen.params
        want_logprobs = bool(p.return_logprob or p.top_logprobs_num)
        with_text = bool(p.return_text_in_logprobs)
        tok = self.engine.tokenizer
        logprobs: list[TokenLogprob] = []
        input_logprobs: list[TokenLogprob] | None = None
        started = time.perf_counter()
        for chunk in self.engine.stream(text, p.sampling_params(), return_logprob=want_logprobs,
                                        logprob_start_len=_start(p.logprob_start_len, want_logprobs),
                                        top_logprobs_num=p.top_logprobs_num or 0, image_data=images,
                                        cache_key=_retention(state), namespace=self.namespace, lora=p.lora):
            logprobs.extend(chunk.logprobs)
            input_logprobs = chunk.input_logprobs if chunk.input_logprobs is not None else input_logprobs
            progress = meta_info(tok, chunk, finished=chunk.finished, return_logprob=want_logprobs,
                                 with_text=with_text, input_logprobs=input_logprobs, output_logprobs=chunk.logprobs)
            if want_logprobs:
                progress["output_token_logprobs_length"] = len(logprobs)
            if not chunk.finished:
                yield GenDelta(chunk.text, progress=progress)
                continue
            if chunk.finish_reason == "abort":
                raise RuntimeError(f"gen {gen.name!r} was aborted: {chunk.error or 'aborted by request'}")
            meta = meta_info(tok, chunk, finished=True, e2e_latency=time.perf_counter() - started,
                             return_logprob=want_logprobs, with_text=with_text,
                             input_logprobs=input_logprobs, output_logprobs=logprobs,
                             weight_version=self.engine.weight_version)
            yield GenDelta(chunk.text, meta, progress)

    def select(self, state: StateView, choices: list[str], method: str | ChoiceMethod) -> tuple[int, dict[str, Any]]:
        """Scores each choice by its tokens' log-probabilities after the prefix, in one batched call.

        Token healing: prefix and choice are tokenized together, because the tokens at their
        boundary may merge (" Paris" after "is", not " " + "Paris"). Every choice is scored from
        the first token where any choice's tokens differ from the prefix's own.
        """
        text, images = self._prompt(state)
        method = resolve_method(method)
        tok = self.engine.tokenizer
        prefix_ids = tok.encode(text) if text else []
        full = [tok.encode(text + c) for c in choices]
        start = min(common_prefix_len(prefix_ids, ids) for ids in full)
        if start == 0:
            raise ValueError("select needs text before it to condition on "
                             "(the first token of the prompt cannot be scored)")
        # the shared KV, computed once, pinned for the state until it moves on (the choices are scored on it)
        self.engine.generate(input_ids=prefix_ids, sampling_params=PREFILL_ONLY, image_data=images,
                             cache_key=_retention(state), namespace=self.namespace)
        outs = self.engine.generate(input_ids=full, sampling_params=PREFILL_ONLY, return_logprob=True,
                                    logprob_start_len=start, image_data=images and [images] * len(full),
                                    namespace=self.namespace)
        assert isinstance(outs, list), "a list of prompts gives a list of completions"
        scored = [self._entries(out.meta.input_logprobs) for out in outs]
        assert all(len(s) == len(ids) - start for s, ids in zip(scored, full)), "one logprob per choice token"
        unconditional = None
        if getattr(method, "requires_unconditional_logprobs", False):
            tails = [ids[start:] for ids in full]
            alone = self.engine.generate(input_ids=tails, sampling_params=PREFILL_ONLY, return_logprob=True,
                                         logprob_start_len=0, namespace=self.namespace)
            assert isinstance(alone, list), "a list of prompts gives a list of completions"
            unconditional = [[(None, tail[0], None)] + self._entries(out.meta.input_logprobs)
                             for tail, out in zip(tails, alone)]
        index, meta = decide(method, choices, scored, unconditional)
        meta["cached_tokens"] = [out.meta.cached_tokens for out in outs]
        return index, meta

    # ---- helpers --------------------------------------------------------------------------------
    def _prompt(self, state: StateView) -> tuple[str, list | None]:
        """The prompt text, with the model's image placeholder where each image goes, and the images."""
        if not state.images:
            return state.text, None
        prompts = self.engine.image_prompts
        if prompts is None:
            reject_images(state, self.engine.model_name)
        assert prompts is not None, "reject_images raised: the state has images"
        return state.with_placeholders(prompts.placeholder), list(state.images)

    @staticmethod
    def _entries(logprobs: list["TokenLogprob"] | None) -> list[tuple]:
        """Scored tokens as (logprob, token_id, None), the choice methods' input."""
        return [(lp.logprob, lp.token_id, None) for lp in logprobs or []]


def _start(logprob_start_len: int | None, want_logprobs: bool) -> int:
    """gen's logprob_start_len for the engine: -1 (no prompt logprobs) unless set with logprobs wanted."""
    return logprob_start_len if want_logprobs and logprob_start_len is not None else -1


def _retention(state: StateView) -> "Retention | None":
    """A program state's sequence stays pinned after each call, until the state's next call moves the pin
    or the run ends; the engine's prompt_cache_retention bounds a run that never says it ended."""
    if state.owner is None:
        return None
    from ..runtime.submission import Retention

    return Retention(state.owner, group=state.owner.rsplit("/", 1)[0])


class Runtime(EngineBackend):
    """An engine in this process, as a backend (SGLang's `Runtime` starts a server; this needs none).

    `Runtime(model=None, **engine_options)`; `model_path=` is accepted as SGLang spells it.
    """

    def __init__(self, model: str | None = None, *, model_path: str | None = None,
                 **engine_options: Any):  # noqa: ANN401 - Engine's own options, passed on for it to check
        from ..runtime.engine import Engine

        if model is not None and model_path is not None:
            raise ValueError("pass model or model_path, not both")
        super().__init__(Engine(model or model_path, **engine_options))

    def shutdown(self) -> None:
        self.engine.shutdown()

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
