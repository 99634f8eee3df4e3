"""The in-process engine: validates requests, hands them to the scheduler thread, gathers outputs."""
from __future__ import annotations

import asyncio
import functools
import logging
import queue
import random
import threading
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Iterator, Mapping, Sequence, TypeVar

import torch

from ..kernels.registry import create_backend
from .config import EngineConfig, available_memory_bytes
from .constrained.compiler import ConstraintCompiler
from .constrained.jump_forward import JumpForwarder
from .constrained.matcher import Constraint
from .constrained.vocab import TokenVocab
from .cuda_graph import DecodeGraphs
from .distributed.embedding_cache import BroadcastEmbeddingCache
from .distributed.group import TensorParallel
from .distributed.layers import kv_heads_per_rank
from .distributed.runner import TPRunner
from .distributed.workers import TPWorkers, WorkerFailure
from .kv_manager import KVManager
from .memory import KVPool, ReqToToken, SlotAllocator
from .model_runner import ModelRunner
from .models.compiled import BackgroundCompile, warm_marker
from .models.llama import LlamaForCausalLM
from .models.loader import load_model
from .multimodal.encoder import ImageEncoder
from .multimodal.prompt import ImagePrompts, ImageSpan, images_per_prompt
from .radix_cache import RadixCache
from .request import Req, StreamChunk
from .sampler import TokenLogprob
from .sampling_params import SamplingParams
from .scheduler import Scheduler
from .speculative.drafter import create_drafter
from .tokenizer import Tokenizer

logger = logging.getLogger(__name__)
T = TypeVar("T")
IDLE_POLL_SECONDS = 0.005
SamplingArg = SamplingParams | Mapping[str, Any] | None


@dataclass(slots=True)
class CompletionMeta:
    rid: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" | "length" | "abort"
    matched_stop: int | str | None = None
    error: str | None = None
    input_logprobs: list[TokenLogprob] | None = None  # scores prompt tokens from logprob_start_len on
    output_logprobs: list[TokenLogprob] | None = None


@dataclass(slots=True)
class Completion:
    text: str
    output_ids: list[int]
    meta: CompletionMeta


@dataclass
class Collector:
    """Folds a request's stream chunks into one Completion."""

    text: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    input_logprobs: list[TokenLogprob] | None = None

    def add(self, chunk: StreamChunk) -> None:
        self.text.append(chunk.text)
        self.ids.extend(chunk.token_ids)
        self.logprobs.extend(chunk.logprobs)
        if chunk.input_logprobs is not None:
            self.input_logprobs = chunk.input_logprobs

    def result(self, last: StreamChunk, with_logprobs: bool) -> Completion:
        meta = CompletionMeta(
            rid=last.rid, prompt_tokens=last.prompt_tokens, cached_tokens=last.cached_tokens,
            completion_tokens=last.completion_tokens, finish_reason=last.finish_reason or "abort",
            matched_stop=last.matched_stop, error=last.error,
            input_logprobs=self.input_logprobs if with_logprobs else None,
            output_logprobs=self.logprobs if with_logprobs else None,
        )
        return Completion("".join(self.text), self.ids, meta)


def collecting_sink(with_logprobs: bool, deliver: Callable[[Completion], None]) -> Callable[[StreamChunk], None]:
    """A request sink that folds chunks where they are made (the scheduler thread) and hands over only the
    Completion: a blocking caller wakes once per request, not once per token, and so does not contend
    with the scheduler thread for the interpreter at every step."""
    collector = Collector()

    def sink(chunk: StreamChunk) -> None:
        collector.add(chunk)
        if chunk.finished:
            deliver(collector.result(chunk, with_logprobs))
    return sink


@dataclass(slots=True)
class _Submission:
    prompt_ids: list[int]
    params: SamplingParams
    return_logprob: bool
    logprob_start_len: int
    top_logprobs_num: int
    rid: str
    constraint: Constraint | None = None
    images: list[ImageSpan] = field(default_factory=list)


@dataclass(slots=True)
class EngineParts:
    scheduler: Scheduler
    tokenizer: Tokenizer
    model_name: str
    vocab_size: int
    pool_size: int
    image_prompts: ImagePrompts | None = None  # None: a text-only model
    image_encoder: ImageEncoder | None = None


def create_scheduler(cfg: EngineConfig) -> EngineParts:
    """Loads the model and builds the KV memory, cache, attention backend, runner and scheduler (no thread)."""
    device, dtype = cfg.torch_device(), cfg.torch_dtype()
    tp = TensorParallel(0, cfg.tp_size)
    loaded = load_model(cfg.model, device, dtype, tp, quantization=cfg.load_quantization())
    mcfg = loaded.model.config
    context_length = cfg.context_length or mcfg.max_position
    if context_length > mcfg.max_position:
        raise ValueError(f"context_length {context_length} exceeds the model's {mcfg.max_position}")
    kv_heads = kv_heads_per_rank(mcfg.num_kv_heads, tp.size)  # each rank's pool holds its own heads
    pool_size = kv_pool_size(cfg, mcfg.num_layers, kv_heads, mcfg.head_dim, dtype, context_length)
    pool = KVPool(pool_size, mcfg.num_layers, kv_heads, mcfg.head_dim, dtype, device)
    allocator = SlotAllocator(pool_size, device)
    req_to_token = ReqToToken(cfg.max_running_requests, context_length, device)
    cache = RadixCache(allocator.free, disable=cfg.disable_radix_cache, device=device)
    attn = create_backend(cfg.attention_backend, pool.k_buffers, pool.v_buffers)
    start_background_compile(cfg, loaded.model, pool)
    graphs = None
    if cfg.use_decode_graphs() and tp.size == 1:  # under TP every step must reach the workers: eager
        graphs = DecodeGraphs(loaded.model, attn, req_to_token.table, pool.pad_slot, cfg.decode_graph_max_bs(),
                              capture=device.type == "cuda")
    vision = loaded.vision
    if vision is not None and tp.size > 1 and cfg.image_cache_mb == 0:
        raise ValueError("image_cache_mb must be > 0 with tp_size > 1: the worker ranks take image embeddings "
                         "from their mirror of rank 0's cache")
    workers = None if tp.size == 1 else TPWorkers(cfg, tp, pool_size, device)
    encoder = None
    if vision is not None:
        publish = None if workers is None else workers.publish_embedding
        encoder = ImageEncoder(vision.module, BroadcastEmbeddingCache(cfg.image_cache_mb, publish), device, dtype)
    image_token_id = 0 if vision is None else vision.image_token_id
    if workers is None:
        runner = ModelRunner(loaded.model, req_to_token, attn, device, graphs, encoder, image_token_id)
    else:
        runner = TPRunner(loaded.model, req_to_token, attn, device, workers, encoder, image_token_id)
    jump = None if cfg.disable_jump_forward else JumpForwarder(loaded.tokenizer)
    kv = KVManager(pool, allocator, req_to_token, cache)
    drafter = create_drafter(cfg, loaded, pool_size, context_length)
    scheduler = Scheduler(cfg, runner, kv, context_length, jump=jump, drafter=drafter)
    return EngineParts(scheduler, loaded.tokenizer, loaded.name, mcfg.vocab_size, pool_size,
                       None if vision is None else ImagePrompts(vision), encoder)


def start_background_compile(cfg: EngineConfig, model: LlamaForCausalLM, pool: KVPool) -> BackgroundCompile | None:
    """The compiled decode forward, built in a background thread while the engine serves eagerly."""
    marker = warm_marker(f"{cfg.model or 'default'}-{cfg.load_quantization()}-{cfg.torch_dtype()}")
    if not cfg.compiles_decode(marker.exists()):
        return None
    make_backend = functools.partial(create_backend, cfg.attention_backend)
    return BackgroundCompile(model, make_backend, pool.k_buffers, pool.v_buffers, marker)


def kv_pool_size(cfg: EngineConfig, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 context_length: int) -> int:
    if cfg.kv_cache_tokens is not None:
        return cfg.kv_cache_tokens
    per_token = KVPool.bytes_per_token(layers, kv_heads, head_dim, dtype)
    tokens = int(cfg.mem_fraction * available_memory_bytes(cfg.torch_device()) / per_token)
    return max(2, min(tokens, cfg.max_running_requests * context_length))


def _resolve(future: asyncio.Future[T], value: T) -> None:
    if not future.done():  # a cancelled caller's future takes no result
        future.set_result(value)


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., object], *args: object) -> None:
    """Runs fn(*args) on the caller's `loop`, from the scheduler thread."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the caller's loop is closed: nobody is listening any more
        pass


def sample_rids(rids: Sequence[str], n: int) -> list[str]:
    """The request id of each of the n samples of each prompt: the prompt's own rid when n == 1."""
    return list(rids) if n == 1 else [f"{r}-{j}" for r in rids for j in range(n)]


class Engine:
    def __init__(self, model: str | None = None, **options: Any):
        self.config = cfg = EngineConfig.from_options(model, **options)
        parts = create_scheduler(cfg)
        self.scheduler, self.tokenizer, self.model_name = parts.scheduler, parts.tokenizer, parts.model_name
        self.device = cfg.torch_device()
        self.vocab_size, self.pool_size = parts.vocab_size, parts.pool_size
        self.image_prompts, self.image_encoder = parts.image_prompts, parts.image_encoder
        self.context_length = self.scheduler.context_length
        self.constraints = ConstraintCompiler(lambda: TokenVocab.from_tokenizer(self.tokenizer, self.vocab_size),
                                              cfg.constrained_json_whitespace_pattern,
                                              json_relaxed=cfg.constrained_json_relaxed)
        self._seeds = random.Random(cfg.seed)
        self._seed_lock = threading.Lock()
        self._inbox: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._closed = False
        self._stopped: str | None = None  # why the engine stopped on its own (a TP worker failure)
        self._thread = threading.Thread(target=self._loop, name="radixlang-scheduler", daemon=True)
        self._thread.start()

    # ---- the scheduler thread -------------------------------------------------------------------
    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        progressed = True
        while True:
            # block when idle; poll when the last step could schedule nothing, so we never spin
            wait = None if not self.scheduler.has_work else 0.0 if progressed else IDLE_POLL_SECONDS
            if not self._drain_inbox(wait):
                break
            try:
                progressed = bool(self.scheduler.step())
            except WorkerFailure as e:  # a TP rank died or hung: the model cannot run again
                logger.error("%s", e)
                self._stopped, self._closed = str(e), True
                break
            except Exception as e:  # never let a bug strand callers: fail their requests instead
                logger.exception("scheduler step failed")
                self.scheduler.abort_all(error=f"internal error: {e!r}")
        self.scheduler.abort_all(error=self._stopped or "engine shut down")
        while True:  # commands that raced with shutdown still run, so no caller waits forever
            try:
                fn = self._inbox.get_nowait()
            except queue.Empty:
                break
            if fn is not None:
                fn()
                self.scheduler.abort_all(error=self._stopped or "engine shut down")

    def _drain_inbox(self, wait: float | None) -> bool:
        """Runs queued commands, waiting up to `wait` seconds for the first (None: until one comes);
        False once shutdown was requested."""
        try:
            fn = self._inbox.get_nowait() if wait == 0.0 else self._inbox.get(timeout=wait)
        except queue.Empty:
            return True
        while True:
            if fn is None:
                return False
            fn()
            try:
                fn = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _call(self, fn: Callable[[], T]) -> Future[T]:
        """Run `fn` on the scheduler thread; the future carries its result or exception."""
        if self._closed:
            raise RuntimeError(self._stopped or "engine is shut down")
        future: Future[T] = Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                future.set_exception(e)

        self._inbox.put(run)
        return future

    def _query(self, fn: Callable[[], T]) -> T:
        """Read scheduler state on its thread, or directly once that thread has stopped."""
        if self._closed and not self._thread.is_alive():
            return fn()
        return self._call(fn).result()

    # ---- request construction ---------------------------------------------------------------------
    def _submissions(self, prompt: str | Sequence[str] | None, sampling_params: SamplingArg,
                     input_ids: Sequence[int] | Sequence[Sequence[int]] | None, return_logprob: bool,
                     logprob_start_len: int, top_logprobs_num: int,
                     rid: str | Sequence[str] | None, image_data: Any = None) -> tuple[list[_Submission], bool]:
        """Validated requests, one per prompt and sample; also whether the caller passed one prompt."""
        prompts, single = self._prompt_ids(prompt, input_ids)
        images, starts = self._images(prompts, image_data, logprob_start_len)
        params = SamplingParams.from_any(sampling_params)
        params.validate(self.vocab_size, self.context_length)
        if not isinstance(top_logprobs_num, int) or not 0 <= top_logprobs_num <= self.vocab_size:
            raise ValueError(f"top_logprobs_num must be in [0, {self.vocab_size}], got {top_logprobs_num!r}")
        if not isinstance(logprob_start_len, int) or logprob_start_len < -1:
            raise ValueError(f"logprob_start_len must be an integer >= -1, got {logprob_start_len!r}")
        rids = self._rids(rid, len(prompts), params.n)
        spec = params.constraint
        constraint = self.constraints.compile(*spec) if spec is not None else None
        subs = []
        for i, ids in enumerate(prompts):
            for j in range(params.n):
                p = params
                if params.n > 1:
                    p = SamplingParams.from_any(params)
                    p.n = 1
                    p.seed = None if params.seed is None else params.seed + j
                subs.append(_Submission(ids, p, return_logprob, starts[i], top_logprobs_num,
                                        rids[i * params.n + j], constraint, images[i]))
        return subs, single

    def _images(self, prompts: list[list[int]], image_data: Any,
                logprob_start_len: int) -> tuple[list[list[ImageSpan]], list[int]]:
        """Expands each prompt's image placeholders into spans (in place); returns the spans and each
        prompt's logprob_start_len in the expanded prompt. `image_data`: images of one prompt, or one
        list per prompt."""
        if image_data is None or (isinstance(image_data, (list, tuple)) and not image_data):
            return [[] for _ in prompts], [logprob_start_len] * len(prompts)
        if self.image_prompts is None:
            raise ValueError(f"model {self.model_name!r} has no vision tower, so it takes no images")
        spans, starts = [], []
        for i, (ids, sources) in enumerate(zip(prompts, images_per_prompt(image_data, len(prompts)))):
            where = "image_data" if len(prompts) == 1 else f"image_data[{i}]"
            ids[:], found, start = self.image_prompts.expand(ids, sources, where, logprob_start=logprob_start_len)
            self._check_length(ids)
            spans.append(found)
            starts.append(start)
        return spans, starts

    def _prompt_ids(self, prompt, input_ids) -> tuple[list[list[int]], bool]:
        if (prompt is None) == (input_ids is None):
            raise ValueError("pass exactly one of prompt and input_ids")
        if prompt is not None:
            single = isinstance(prompt, str)
            texts = [prompt] if single else list(prompt)
            if not all(isinstance(t, str) for t in texts):
                raise ValueError("prompt must be a string or a list of strings")
            batch = [self.tokenizer.encode(t) if t else [] for t in texts]
        else:
            single = bool(input_ids) and not isinstance(input_ids[0], (list, tuple))
            batch = [list(input_ids)] if single else [list(x) for x in input_ids]
        if not batch:
            raise ValueError("no prompts given")
        for ids in batch:
            self._check_prompt(ids)
        return batch, single

    def _check_prompt(self, ids: list[int]) -> None:
        if not ids:
            raise ValueError("prompt is empty")
        if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < self.vocab_size for t in ids):
            raise ValueError(f"input_ids must be token ids in [0, {self.vocab_size})")
        self._check_length(ids)

    def _check_length(self, ids: list[int]) -> None:
        if len(ids) >= self.context_length:
            raise ValueError(
                f"prompt has {len(ids)} tokens; the context holds {self.context_length}, "
                "so a prompt may have at most one token fewer"
            )
        if len(ids) + 1 > self.pool_size:
            raise ValueError(f"prompt has {len(ids)} tokens but the KV pool holds only {self.pool_size}")

    @staticmethod
    def _rids(rid: str | Sequence[str] | None, num_prompts: int, n: int) -> list[str]:
        total = num_prompts * n
        if rid is None:
            return [uuid.uuid4().hex for _ in range(total)]
        given = [rid] if isinstance(rid, str) else list(rid)
        if len(given) != num_prompts or not all(isinstance(r, str) and r for r in given):
            raise ValueError(f"rid must be one non-empty string per prompt ({num_prompts})")
        return sample_rids(given, n)

    def _make_req(self, sub: _Submission, sink: Callable[[StreamChunk], None]) -> Req:
        seed = sub.params.seed
        if seed is None:
            with self._seed_lock:
                seed = self._seeds.getrandbits(63)
        return Req.create(sub.rid, sub.prompt_ids, sub.params, self.tokenizer, sink,
                          context_length=self.context_length, seed=seed, device=self.device,
                          return_logprob=sub.return_logprob, logprob_start_len=sub.logprob_start_len,
                          top_logprobs_num=sub.top_logprobs_num, constraint=sub.constraint, images=sub.images)

    def _enqueue(self, sub: _Submission, sink: Callable[[StreamChunk], None]) -> None:
        req = self._make_req(sub, sink)
        self._call(lambda: self.scheduler.add(req))

    def _prefill_shared(self, subs: list[_Submission]) -> list[_Submission]:
        """For n > 1, the prompts computed once up front, so the n samples share their KV."""
        if self.config.disable_radix_cache:
            return []
        seen: dict[tuple[int, ...], _Submission] = {}
        for s in subs:
            seen.setdefault(tuple(s.prompt_ids), s)
        return [_Submission(s.prompt_ids, SamplingParams(max_new_tokens=0), False, -1, 0, uuid.uuid4().hex,
                            images=s.images) for s in seen.values()] if len(seen) < len(subs) else []

    # ---- public API -------------------------------------------------------------------------------
    def generate(self, prompt: str | Sequence[str] | None = None, sampling_params: SamplingArg = None, *,
                 input_ids: Sequence[int] | Sequence[Sequence[int]] | None = None,
                 return_logprob: bool = False, logprob_start_len: int = -1, top_logprobs_num: int = 0,
                 rid: str | Sequence[str] | None = None, image_data: Any = None) -> Completion | list[Completion]:
        """Blocking generation. One prompt (n=1) gives a Completion; otherwise a list, prompt-major.
        `image_data`: a vision model's images (paths, bytes, data URLs, PIL images), one per placeholder
        (`image_prompts.placeholder`) in the prompt; for a batch, one list per prompt."""
        subs, single = self._submissions(prompt, sampling_params, input_ids, return_logprob,
                                         logprob_start_len, top_logprobs_num, rid, image_data)
        self._run_blocking(self._prefill_shared(subs))
        results = self._run_blocking(subs)
        return results[0] if single and len(results) == 1 else results

    def _run_blocking(self, subs: list[_Submission]) -> list[Completion]:
        done: queue.Queue[tuple[int, Completion]] = queue.Queue()
        for i, s in enumerate(subs):
            self._enqueue(s, collecting_sink(s.return_logprob, lambda c, i=i: done.put((i, c))))
        results: list[Completion | None] = [None] * len(subs)
        for _ in subs:
            i, completion = done.get()
            results[i] = completion
        return results  # type: ignore[return-value]

    def stream(self, prompt: str | None = None, sampling_params: SamplingArg = None, *,
               input_ids: Sequence[int] | None = None, return_logprob: bool = False,
               logprob_start_len: int = -1, top_logprobs_num: int = 0,
               rid: str | None = None, image_data: Any = None) -> Iterator[StreamChunk]:
        """Yields text as it is decided; closing the iterator early aborts the request."""
        sub = self._single_stream_submission(prompt, sampling_params, input_ids, return_logprob,
                                             logprob_start_len, top_logprobs_num, rid, image_data)
        inbox: queue.Queue[StreamChunk] = queue.Queue()
        self._enqueue(sub, inbox.put)
        finished = False
        try:
            while not finished:
                chunk = inbox.get()
                finished = chunk.finished
                yield chunk
        finally:
            if not finished:
                self.abort(sub.rid)

    def _single_stream_submission(self, prompt, sampling_params, input_ids, return_logprob,
                                  logprob_start_len, top_logprobs_num, rid, image_data=None) -> _Submission:
        if prompt is not None and not isinstance(prompt, str):
            raise ValueError("stream takes a single prompt string")
        subs, single = self._submissions(prompt, sampling_params, input_ids, return_logprob,
                                         logprob_start_len, top_logprobs_num, rid, image_data)
        if not single or len(subs) != 1:
            raise ValueError("stream takes one prompt and n=1")
        return subs[0]

    async def async_generate(self, prompt: str | Sequence[str] | None = None,
                             sampling_params: SamplingArg = None, **kwargs: Any) -> Completion | list[Completion]:
        subs, single = self._kwargs_submissions(prompt, sampling_params, kwargs)
        await self._async_run(self._prefill_shared(subs))
        results = await self._async_run(subs)
        return results[0] if single and len(results) == 1 else results

    def _kwargs_submissions(self, prompt, sampling_params, kwargs: dict[str, Any]) -> tuple[list[_Submission], bool]:
        result = self._submissions(prompt, sampling_params, kwargs.pop("input_ids", None),
                                   kwargs.pop("return_logprob", False), kwargs.pop("logprob_start_len", -1),
                                   kwargs.pop("top_logprobs_num", 0), kwargs.pop("rid", None),
                                   kwargs.pop("image_data", None))
        if kwargs:
            raise TypeError(f"unexpected arguments {sorted(kwargs)}")
        return result

    async def _async_run(self, subs: list[_Submission]) -> list[Completion]:
        return list(await asyncio.gather(*(self._async_one(s) for s in subs)))

    async def _async_one(self, sub: _Submission) -> Completion:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Completion] = loop.create_future()

        self._enqueue(sub, collecting_sink(sub.return_logprob, lambda c: _call_soon(loop, _resolve, done, c)))
        try:
            return await done
        except asyncio.CancelledError:  # the caller gave up (which cancels `done` too): free the request's KV
            self.abort(sub.rid)
            raise

    async def async_stream(self, prompt: str | None = None, sampling_params: SamplingArg = None,
                           **kwargs: Any) -> AsyncIterator[StreamChunk]:
        """Async `stream`; cancelling or closing it aborts the request and frees its KV."""
        sub = self._single_stream_submission(
            prompt, sampling_params, kwargs.pop("input_ids", None), kwargs.pop("return_logprob", False),
            kwargs.pop("logprob_start_len", -1), kwargs.pop("top_logprobs_num", 0), kwargs.pop("rid", None),
            kwargs.pop("image_data", None))
        if kwargs:
            raise TypeError(f"unexpected arguments {sorted(kwargs)}")
        async for _, chunk in self._async_chunks([sub]):
            yield chunk

    def async_stream_batch(self, prompt: str | Sequence[str] | None = None, sampling_params: SamplingArg = None,
                           **kwargs: Any) -> AsyncIterator[tuple[int, StreamChunk]]:
        """Streams every prompt and sample at once as (index, chunk), indexed prompt-major like
        `generate`'s list. Validates on the call (ValueError before anything runs); cancelling or
        closing the iterator aborts what is unfinished."""
        subs, _ = self._kwargs_submissions(prompt, sampling_params, kwargs)
        return self._stream_subs(subs)

    async def _stream_subs(self, subs: list[_Submission]) -> AsyncIterator[tuple[int, StreamChunk]]:
        await self._async_run(self._prefill_shared(subs))
        async for item in self._async_chunks(subs):
            yield item

    async def _async_chunks(self, subs: list[_Submission]) -> AsyncIterator[tuple[int, StreamChunk]]:
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[tuple[int, StreamChunk]] = asyncio.Queue()

        def sink(i: int) -> Callable[[StreamChunk], None]:
            return lambda chunk: _call_soon(loop, inbox.put_nowait, (i, chunk))

        live: set[int] = set()
        try:
            for i, sub in enumerate(subs):
                self._enqueue(sub, sink(i))
                live.add(i)
            while live:
                i, chunk = await inbox.get()
                if chunk.finished:
                    live.discard(i)
                yield i, chunk
        finally:
            for i in live:
                self.abort(subs[i].rid)

    def abort(self, rid: str) -> None:
        """Ends the request (its final chunk has finish_reason 'abort'); unknown ids are ignored."""
        if not self._closed:
            self._call(lambda: self.scheduler.abort(rid))

    def flush_cache(self) -> bool:
        """Evicts every cached prefix not in use; True when the tree is empty afterwards."""
        return self._call(self.scheduler.flush).result()

    def check_invariants(self) -> None:
        """Asserts the KV memory invariant (free + tree + live requests = pool) on the scheduler thread."""
        self._query(self.scheduler.check_invariants)

    def stats(self) -> dict[str, float]:
        return self._query(self.scheduler.stats)

    def shutdown(self) -> None:
        """Aborts what is still in flight and stops the scheduler thread."""
        if not self._closed:
            self._closed = True
            self._inbox.put(None)
        self._thread.join()
        self.scheduler.runner.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
