"""The in-process backend: programs call an `Engine` directly."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from .backend import GenDelta, StateView, reject_images
from .chat import ChatTemplate
from .choices import common_prefix_len, decide, resolve_method
from .ir import Gen

if TYPE_CHECKING:
    from ..runtime.engine import Engine
    from ..runtime.request import StreamChunk
    from ..runtime.sampler import TokenLogprob

_PREFILL_ONLY = {"max_new_tokens": 0}


class EngineBackend:
    def __init__(self, engine: "Engine"):
        self.engine = engine

    # ---- Backend protocol -----------------------------------------------------------------------
    def chat_template(self) -> ChatTemplate | None:
        tok = self.engine.tokenizer
        return ChatTemplate(tok.apply_chat_template) if tok.chat_template else None

    def cache_prefix(self, text: str) -> None:
        if text:
            self.engine.generate(text, _PREFILL_ONLY)

    def flush_cache(self) -> bool:
        return self.engine.flush_cache()

    def generate(self, state: StateView, gen: Gen) -> Iterator[GenDelta]:
        reject_images(state, self.engine.model_name)
        if not state.text:
            raise ValueError(f"gen {gen.name!r} has no text before it to condition on")
        p = gen.params
        want_logprobs = bool(p.return_logprob or p.top_logprobs_num)
        logprobs: list[TokenLogprob] = []
        for chunk in self.engine.stream(state.text, p.sampling_params(), return_logprob=want_logprobs,
                                        top_logprobs_num=p.top_logprobs_num or 0):
            logprobs.extend(chunk.logprobs)
            if not chunk.finished:
                if chunk.text:
                    yield GenDelta(chunk.text)
                continue
            if chunk.finish_reason == "abort":
                raise RuntimeError(f"gen {gen.name!r} was aborted: {chunk.error or 'aborted by request'}")
            yield GenDelta(chunk.text, self._gen_meta(chunk, logprobs if want_logprobs else None,
                                                      bool(p.return_text_in_logprobs)))

    def select(self, state: StateView, choices: list[str], method: Any) -> tuple[int, dict[str, Any]]:
        """Scores each choice by its tokens' log-probabilities after the prefix, in one batched call.

        Token healing: prefix and choice are tokenized together, because the tokens at their
        boundary may merge (" Paris" after "is", not " " + "Paris"). Every choice is scored from
        the first token where any choice's tokens differ from the prefix's own.
        """
        reject_images(state, self.engine.model_name)
        method = resolve_method(method)
        tok = self.engine.tokenizer
        prefix_ids = tok.encode(state.text) if state.text else []
        full = [tok.encode(state.text + c) for c in choices]
        start = min(common_prefix_len(prefix_ids, ids) for ids in full)
        if start == 0:
            raise ValueError("select needs text before it to condition on "
                             "(the first token of the prompt cannot be scored)")
        self.engine.generate(input_ids=prefix_ids, sampling_params=_PREFILL_ONLY)  # shared KV, computed once
        outs = self.engine.generate(input_ids=full, sampling_params=_PREFILL_ONLY, return_logprob=True,
                                    logprob_start_len=start)
        scored = [self._entries(out.meta.input_logprobs, False) for out in outs]
        assert all(len(s) == len(ids) - start for s, ids in zip(scored, full)), "one logprob per choice token"
        unconditional = None
        if getattr(method, "requires_unconditional_logprobs", False):
            tails = [ids[start:] for ids in full]
            alone = self.engine.generate(input_ids=tails, sampling_params=_PREFILL_ONLY, return_logprob=True,
                                         logprob_start_len=0)
            unconditional = [[(None, tail[0], None)] + self._entries(out.meta.input_logprobs, False)
                             for tail, out in zip(tails, alone)]
        index, meta = decide(method, choices, scored, unconditional)
        meta["cached_tokens"] = [out.meta.cached_tokens for out in outs]
        return index, meta

    # ---- helpers --------------------------------------------------------------------------------
    def _entries(self, logprobs: list["TokenLogprob"] | None, with_text: bool) -> list[tuple]:
        decode = self.engine.tokenizer.decode
        return [(lp.logprob, lp.token_id, decode([lp.token_id], False) if with_text else None)
                for lp in logprobs or []]

    def _gen_meta(self, last: "StreamChunk", logprobs: list["TokenLogprob"] | None,
                  with_text: bool) -> dict[str, Any]:
        reason: dict[str, Any] = {"type": last.finish_reason}
        if last.finish_reason == "stop":
            reason["matched"] = last.matched_stop
        else:
            reason["length"] = last.completion_tokens
        meta: dict[str, Any] = {"id": last.rid, "prompt_tokens": last.prompt_tokens,
                                "cached_tokens": last.cached_tokens, "completion_tokens": last.completion_tokens,
                                "finish_reason": reason}
        if logprobs is not None:
            decode = self.engine.tokenizer.decode
            meta["output_token_logprobs"] = self._entries(logprobs, with_text)
            meta["output_top_logprobs"] = [[(v, t, decode([t], False) if with_text else None) for t, v in lp.top]
                                           for lp in logprobs]
        return meta


class Runtime(EngineBackend):
    """An engine in this process, as a backend (SGLang's `Runtime` starts a server; this needs none).

    `Runtime(model=None, **engine_options)`; `model_path=` is accepted as SGLang spells it.
    """

    def __init__(self, model: str | None = None, *, model_path: str | None = None, **engine_options: Any):
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
