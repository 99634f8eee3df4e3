"""The in-process engine: `prepare` validates a call into Submissions, `submit` hands one to the
scheduler thread; the generate / stream forms are thin adapters over those two."""
from __future__ import annotations

import asyncio
import json
import queue
import random
import threading
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Iterable,
    Iterator,
    Sequence,
    TypedDict,
    TypeVar,
)

import torch

from .completion import Collector, Completion, CompletionMeta, collecting_sink
from .config import EngineConfig
from .constrained.compiler import ConstraintCompiler
from .constrained.masks.vocab import TokenVocab
from .constrained.matcher import Constraint, Matcher
from .detokenizer import IncrementalDetokenizer
from .execution.sampler import SamplingState
from .image_span import ImageSpan
from .lora.adapter import load_peft_adapter
from .models.eplb import Placement, plan_rebalance
from .models.loading.loader import default_model_path
from .models.loading.weight_cache import write_when_idle
from .models.moe_llama import moe_blocks
from .multimodal.prompt import text_ids
from .namespace import DEFAULT_NAMESPACE, Namespace
from .openmp_workers import release_openmp_workers
from .profiler import ProfileSpec, StepProfiler
from .reasoning_formats import resolve_reasoning_parser
from .request import Req, StreamChunk
from .sampling_params import SamplingParams
from .scheduler_thread import SchedulerThread
from .scheduling.scheduler import Scheduler
from .submission import Retention, Submission, SubmissionBatch, sample_rids
from .tokenizer import Tokenizer
from .tool_formats import FORMATS, ToolFormat, detect_format
from .validation import InputIds, Prompts, RequestValidator, SamplingArg
from .weight_updates import LiveWeights, UpdateResult
from .wiring import EngineParts, create_scheduler, kv_pool_size

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from Python 3.11

    from .lora.pool import LoraPool

# re-exported: callers imported these from here before the engine was split
__all__ = ["Collector", "Completion", "CompletionMeta", "Engine", "EngineParts", "collecting_sink",
           "create_scheduler", "kv_pool_size", "sample_rids"]
T = TypeVar("T")
Sink = Callable[[StreamChunk], None]


class PrepareOptions(TypedDict, total=False):
    """`prepare`'s keyword arguments, as the generate and stream forms pass them on (mypy checks each
    against `prepare`'s signature where they are passed)."""

    input_ids: InputIds
    return_logprob: bool
    logprob_start_len: int
    top_logprobs_num: int
    rid: str | Sequence[str] | None
    image_data: object
    cache_key: str | Retention | None
    priority: int
    namespace: Namespace
    lora: str | Sequence[str | None] | None


def _resolve(future: asyncio.Future[T], value: T) -> None:
    if not future.done():  # a cancelled caller's future takes no result
        future.set_result(value)


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., object], *args: object) -> None:
    """Runs fn(*args) on the caller's `loop`, from the scheduler thread."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the caller's loop is closed: nobody is listening any more
        pass


def _unwrap(batch: SubmissionBatch, results: list[Completion]) -> Completion | list[Completion]:
    return results[0] if batch.single and len(results) == 1 else results


def create_req(rid: str, prompt_ids: list[int], params: SamplingParams, tokenizer: Tokenizer,
               sink: Callable[[StreamChunk], None], *, context_length: int, seed: int, device: torch.device,
               return_logprob: bool = False, logprob_start_len: int = -1, top_logprobs_num: int = 0,
               constraint: Constraint | None = None, images: list[ImageSpan] | None = None,
               close_within_max_tokens: bool = True) -> Req:
    """A request with its sampler, constraint and detokenizer state; `params` must be validated.
    `close_within_max_tokens`: a constrained output is closed within max_new_tokens (constrained/closing.py)."""
    token_ids = text_ids(prompt_ids) if images else prompt_ids
    sampling = SamplingState.create(params, token_ids, tokenizer.eos_token_ids,
                                    tokenizer.vocab_size, device, seed)
    max_new_tokens = min(params.max_new_tokens, context_length - len(prompt_ids))
    matcher = None
    if constraint is not None:  # EOS ends a constrained output unless the caller ignores EOS
        end_ids = tuple(i for i in constraint.vocab.end_ids if i in sampling.stop_ids)
        matcher = Matcher(constraint, end_ids, max_new_tokens if close_within_max_tokens else None)
    return Req(
        rid=rid,
        prompt_ids=prompt_ids,
        params=params,
        sampling=sampling,
        constraint=matcher,
        # a tool call's marker token is the parser's cue: keep its text (the constraint allows no other special)
        detok=IncrementalDetokenizer(tokenizer, params.stop,
                                     params.skip_special_tokens and not getattr(constraint, "keeps_marker_text", False),
                                     trim_stop=not params.no_stop_trim, context_ids=token_ids,
                                     stop_regex=params.stop_regex),
        sink=sink,
        max_new_tokens=max_new_tokens,
        return_logprob=return_logprob,
        logprob_start_len=logprob_start_len,
        top_logprobs_num=top_logprobs_num,
        images=list(images or ()),
    )


class Engine:
    def __init__(self, model: str | None = None,
                 **options: Any):  # noqa: ANN401 - EngineConfig's fields, each of its own type (checked there)
        self.config = cfg = EngineConfig.from_options(model, **options)
        parts = create_scheduler(cfg)
        self.core, self.tokenizer, self.model_name = parts.core, parts.tokenizer, parts.model_name
        self.scheduler, self.runner = parts.core.scheduler, parts.core.runner
        self.device = cfg.torch_device()
        self.vocab_size, self.pool_size = parts.vocab_size, parts.pool_size
        self.image_prompts, self.image_encoder = parts.image_prompts, parts.image_encoder
        self.decode_compile = parts.decode_compile
        self.context_length = self.scheduler.context_length
        self.constraints = ConstraintCompiler(lambda: TokenVocab.from_tokenizer(self.tokenizer, self.vocab_size),
                                              cfg.constrained_json_whitespace_pattern,
                                              json_relaxed=cfg.constrained_json_relaxed,
                                              compile_timeout=cfg.constraint_compile_timeout,
                                              precompute_ms=cfg.constraint_precompute_ms,
                                              backend=cfg.grammar_backend,
                                              encode=lambda text: self.tokenizer.encode(text, add_special_tokens=False))
        self.lora = parts.lora
        self.validator = RequestValidator(self.tokenizer, self.model_name, self.vocab_size, self.context_length,
                                          self.pool_size, self.constraints, self.image_prompts,
                                          share_prefills=not cfg.disable_radix_cache, adapters=self.lora)
        self._load_start_adapters(cfg)
        self._set_up_chat(cfg)
        self._seeds = random.Random(cfg.seed)
        self._seed_lock = threading.Lock()
        self.profiler = StepProfiler()  # its state is the scheduler thread's
        self._thread = SchedulerThread(self.core, after_step=self.profiler.after_step)
        release_openmp_workers()  # this thread's, from loading: the model runs on the scheduler thread's
        self.weights = LiveWeights(cfg, self._thread, self.scheduler, self.runner.model, self.image_encoder is not None,
                                   getattr(self.runner, "workers", None))  # TPRunner's worker ranks
        write_when_idle(self._thread)  # a converting start's weight cache write waits out the first requests
        if self.decode_compile is not None:  # once the engine is up, and idle
            self.decode_compile.start(self._thread.idle_seconds)

    # ---- the one way in ---------------------------------------------------------------------------
    def prepare(self, prompt: Prompts = None, sampling_params: SamplingArg = None, *, input_ids: InputIds = None,
                return_logprob: bool = False, logprob_start_len: int = -1, top_logprobs_num: int = 0,
                rid: str | Sequence[str] | None = None, image_data: object = None,
                cache_key: str | Retention | None = None, priority: int = 0,
                namespace: Namespace = DEFAULT_NAMESPACE,
                lora: str | Sequence[str | None] | None = None) -> SubmissionBatch:
        """Validates one call (ValueError / TypeError naming the field) into its Submissions: one per
        prompt and sample, prompt-major. `image_data`: a vision model's images (paths, bytes, data URLs,
        PIL images), one per placeholder (`image_prompts.placeholder`); for a batch, one list per prompt.
        `cache_key`: a session key (OpenAI's prompt_cache_key): once finished, the whole sequence stays
        pinned for prompt_cache_retention seconds, and the key's next request refreshes it. `priority`:
        SGLang's; a larger one is admitted first and may preempt running requests of a lower one.
        `namespace`: the requests reuse cached KV only from requests of the same namespace (a tenant).
        `lora`: a loaded LoRA adapter's name, or one (None: the base model) per prompt (runtime/lora.UnknownAdapter
        if one is not loaded)."""
        return self.validator.build(prompt, sampling_params, input_ids=input_ids, return_logprob=return_logprob,
                                    logprob_start_len=logprob_start_len, top_logprobs_num=top_logprobs_num,
                                    rid=rid, image_data=image_data, retain=cache_key, priority=priority,
                                    namespace=namespace, lora=lora)

    def submit(self, sub: Submission, sink: Sink) -> None:
        """Queues a validated request; `sink` gets its chunks on the scheduler thread, the last one
        with finished=True (an rid already in flight ends at once with finish_reason 'abort')."""
        self.submit_all([(sub, sink)])

    def submit_all(self, items: list[tuple[Submission, Sink]]) -> None:
        """Queues validated requests in one command: no step runs between two of them, so a batch's prompts are
        admitted together (one at a time, the first could prefill and decode alone)."""
        reqs = [self._make_req(sub, sink) for sub, sink in items]
        release_openmp_workers()  # the caller's: it now waits on the scheduler thread (openmp_workers.py)

        def add_all() -> None:
            for req in reqs:
                self.scheduler.add(req)

        self._thread.call(add_all)

    def _make_req(self, sub: Submission, sink: Sink) -> Req:
        seed = sub.params.seed
        if seed is None:
            with self._seed_lock:
                seed = self._seeds.getrandbits(63)
        req = create_req(sub.rid, sub.prompt_ids, sub.params, self.tokenizer, sink,
                         context_length=self.context_length, seed=seed, device=self.device,
                         return_logprob=sub.return_logprob, logprob_start_len=sub.logprob_start_len,
                         top_logprobs_num=sub.top_logprobs_num, constraint=sub.constraint, images=sub.images,
                         close_within_max_tokens=not self.config.disable_constrained_close)
        req.retain, req.priority, req.namespace, req.lora = sub.retain, sub.priority, sub.namespace, sub.lora
        return req

    # ---- running prepared batches -----------------------------------------------------------------
    def run(self, batch: SubmissionBatch) -> list[Completion]:
        """Blocks until every request of `batch` is done; results prompt-major."""
        self._run_blocking(batch.shared_prefills)
        return self._run_blocking(batch.requests)

    def _run_blocking(self, subs: list[Submission]) -> list[Completion]:
        done: queue.Queue[tuple[int, Completion]] = queue.Queue()

        def put(i: int) -> Callable[[Completion], None]:
            return lambda c: done.put((i, c))

        self.submit_all([(s, collecting_sink(s.return_logprob, put(i))) for i, s in enumerate(subs)])
        results: dict[int, Completion] = {}
        for _ in subs:
            i, completion = done.get()
            results[i] = completion
        return [results[i] for i in range(len(subs))]

    def chunks(self, sub: Submission) -> Iterator[StreamChunk]:
        """One request's chunks as they are decided; closing the iterator early aborts the request."""
        inbox: queue.Queue[StreamChunk] = queue.Queue()
        self.submit(sub, inbox.put)
        finished = False
        try:
            while not finished:
                chunk = inbox.get()
                finished = chunk.finished
                yield chunk
        finally:
            if not finished:
                self.abort(sub.rid)

    async def async_run(self, batch: SubmissionBatch) -> list[Completion]:
        """`run` for an event loop; cancelling it aborts the unfinished requests and frees their KV."""
        await self._async_all(batch.shared_prefills)
        return await self._async_all(batch.requests)

    async def _async_all(self, subs: list[Submission]) -> list[Completion]:
        loop = asyncio.get_running_loop()
        dones: list[asyncio.Future[Completion]] = [loop.create_future() for _ in subs]

        def resolve(done: asyncio.Future[Completion]) -> Callable[[Completion], None]:
            return lambda c: _call_soon(loop, _resolve, done, c)

        self.submit_all([(s, collecting_sink(s.return_logprob, resolve(d))) for s, d in zip(subs, dones)])
        try:
            return list(await asyncio.gather(*dones))
        except asyncio.CancelledError:  # the caller gave up (which cancels the futures too): free the requests' KV
            for sub, done in zip(subs, dones):
                if not done.done() or done.cancelled():
                    self.abort(sub.rid)
            raise

    async def async_chunks(self, batch: SubmissionBatch) -> AsyncGenerator[tuple[int, StreamChunk], None]:
        """Every request's chunks as (index in batch.requests, chunk); cancelling or closing the
        iterator aborts what is unfinished."""
        await self._async_all(batch.shared_prefills)
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[tuple[int, StreamChunk]] = asyncio.Queue()

        def sink(i: int) -> Sink:
            return lambda chunk: _call_soon(loop, inbox.put_nowait, (i, chunk))

        subs, live = batch.requests, set[int]()
        try:
            self.submit_all([(sub, sink(i)) for i, sub in enumerate(subs)])
            live.update(range(len(subs)))
            while live:
                i, chunk = await inbox.get()
                if chunk.finished:
                    live.discard(i)
                yield i, chunk
        finally:
            for i in live:
                self.abort(subs[i].rid)

    # ---- the generate forms: prepare, then run ----------------------------------------------------
    def generate(self, prompt: Prompts = None, sampling_params: SamplingArg = None,
                 **options: Unpack[PrepareOptions]) -> Completion | list[Completion]:
        """Blocking generation (`prepare`'s arguments). One prompt (n=1) gives a Completion; otherwise a
        list, prompt-major."""
        batch = self.prepare(prompt, sampling_params, **options)
        return _unwrap(batch, self.run(batch))

    async def async_generate(self, prompt: Prompts = None, sampling_params: SamplingArg = None,
                             **options: Unpack[PrepareOptions]) -> Completion | list[Completion]:
        batch = self.prepare(prompt, sampling_params, **options)
        return _unwrap(batch, await self.async_run(batch))

    def stream(self, prompt: str | None = None, sampling_params: SamplingArg = None,
               **options: Unpack[PrepareOptions]) -> Iterator[StreamChunk]:
        """Yields one prompt's text as it is decided; closing the iterator early aborts the request."""
        return self.chunks(self._one(prompt, sampling_params, options))

    async def async_stream(self, prompt: str | None = None, sampling_params: SamplingArg = None,
                           **options: Unpack[PrepareOptions]) -> AsyncIterator[StreamChunk]:
        """Async `stream`; cancelling or closing it aborts the request and frees its KV."""
        batch = SubmissionBatch([self._one(prompt, sampling_params, options)], [], True)
        async for _, chunk in self.async_chunks(batch):
            yield chunk

    def async_stream_batch(self, prompt: Prompts = None, sampling_params: SamplingArg = None,
                           **options: Unpack[PrepareOptions]) -> AsyncGenerator[tuple[int, StreamChunk], None]:
        """Streams every prompt and sample at once as (index, chunk), indexed prompt-major like
        `generate`'s list. Validates on the call (ValueError before anything runs)."""
        return self.async_chunks(self.prepare(prompt, sampling_params, **options))

    def _one(self, prompt: str | None, sampling_params: SamplingArg, options: PrepareOptions) -> Submission:
        if prompt is not None and not isinstance(prompt, str):
            raise ValueError("stream takes a single prompt string")
        batch = self.prepare(prompt, sampling_params, **options)
        if not batch.single or len(batch.requests) != 1:
            raise ValueError("stream takes one prompt and n=1")
        return batch.requests[0]

    @property
    def model_path(self) -> str:
        """The model as loaded: the path given, else the default model's GGUF file (SGLang's model_path)."""
        return self.config.model or str(default_model_path())

    # ---- control ----------------------------------------------------------------------------------
    def abort(self, rid: str) -> None:
        """Ends the request (its final chunk has finish_reason 'abort'); unknown ids are ignored."""
        if not self._thread.closed:
            self._thread.call(lambda: self.scheduler.abort(rid))

    def flush_cache(self) -> bool:
        """Evicts every cached prefix not in use; True when the tree is empty afterwards."""
        return self._thread.call(self.scheduler.flush).result()

    # ---- live weights (runtime/weight_updates.py) -------------------------------------------------
    @property
    def weight_version(self) -> str:
        """The version of the weights served, as the last update (or the weight_version option) named it."""
        return self.weights.version

    def update_weights_from_disk(self, model_path: str, load_format: str | None = None,
                                 abort_all_requests: bool = False, weight_version: str | None = None) -> UpdateResult:
        """SGLang's: serves the weights of another checkpoint of the same architecture and shapes (ValueError
        naming the mismatch, the old weights untouched). Requests in flight finish on the old weights first
        (new ones wait), or are aborted with `abort_all_requests`; every cached KV of the old weights is
        flushed."""
        return self.weights.from_disk(model_path, load_format, abort_all_requests, weight_version)

    def update_weights_from_tensor(self, named_tensors: Iterable[tuple[str, torch.Tensor]],
                                   weight_version: str | None = None,
                                   abort_all_requests: bool = False) -> UpdateResult:
        """SGLang's: copies HF-named tensors into the model (only those change), as update_weights_from_disk
        settles the requests in flight and flushes the old KV."""
        return self.weights.from_tensors(named_tensors, abort_all_requests, weight_version)

    def pause_generation(self, mode: str = "in_place") -> int:
        """SGLang's: no step runs until continue_generation; requests stay queued or running with their KV
        ("abort": aborted first). An update while paused retracts the running ones. Returns how many it
        aborted."""
        return self.weights.pause(mode)

    def continue_generation(self) -> None:
        self.weights.resume()

    def release_cache_key(self, key: str | Retention) -> int:
        """Drops a session's pin (or a Retention's owner's); how many tokens it pinned (0: none)."""
        owner = (Retention.session(key) if isinstance(key, str) else key).owner
        return self._thread.call(lambda: self.scheduler.unpin(owner)).result()

    def release_pins(self, group: str) -> None:
        """Drops every pin of `group` (a program's states); returns at once."""
        if not self._thread.closed:
            self._thread.call(lambda: self.scheduler.unpin_group(group))

    # ---- LoRA adapters (runtime/lora, docs/lora.md) ---------------------------------------------------
    def load_lora_adapter(self, name: str, path: str | Path) -> None:
        """Serves the PEFT adapter folder `path` as `name` (ValueError naming what does not fit)."""
        if not isinstance(name, str) or not name or "=" in name:
            raise ValueError(f"lora_name must be a non-empty string without '=', got {name!r}")
        pool = self._require_lora()
        adapter = load_peft_adapter(name, path)  # read here, off the scheduler thread
        self._thread.query(lambda: pool.add(adapter))

    def unload_lora_adapter(self, name: str) -> None:
        """Stops serving `name` (UnknownAdapter if not loaded): new requests are refused at once; the adapter's
        weights and cached KV go when its last running request ends."""
        self._require_lora()
        scheduler = self.scheduler
        assert isinstance(scheduler, Scheduler), "adapters are served without DP attention (one scheduler)"
        self._thread.query(lambda: scheduler.unload_adapter(name))

    def lora_adapters(self) -> dict[str, str]:
        """The adapters served: name -> the folder it was loaded from."""
        return {} if self.lora is None else {a.name: a.path for a in list(self.lora.adapters.values())}

    def _require_lora(self) -> LoraPool:
        if self.lora is None:
            raise ValueError("LoRA adapters are served on dense Llama-family models with tp_size 1 and no DP "
                             "attention; this engine serves none")
        return self.lora

    def _load_start_adapters(self, cfg: EngineConfig) -> None:
        specs = cfg.lora_adapters()
        if not specs:
            return
        pool = self._require_lora()
        adapters = [load_peft_adapter(name, path) for name, path in specs]
        if pool.max_rank is None:  # sized for the largest given now
            pool.max_rank = max(a.rank for a in adapters)
        for adapter in adapters:  # before the scheduler thread starts: nothing else reads the pool yet
            pool.add(adapter)

    def start_profile(self, spec: ProfileSpec | None = None) -> Path:
        """Starts torch.profiler over the scheduler's steps (ValueError if one runs); the trace's future path."""
        return self._thread.call(lambda: self.profiler.start(spec or ProfileSpec())).result()

    def stop_profile(self) -> Path:
        """Stops the profiler and writes its Chrome trace (ValueError if none runs); the trace's path."""
        return self._thread.call(self.profiler.stop).result()

    def _set_up_chat(self, cfg: EngineConfig) -> None:
        """The chat template (the model's, or --chat-template's file), the reasoning parser and tool-call
        format it implies (or as set), and the arguments every render gets."""
        if cfg.chat_template is not None:
            self.tokenizer.chat_template = Path(cfg.chat_template).read_text()
        template = self.tokenizer.chat_template
        self.reasoning_parser: str | None = resolve_reasoning_parser(cfg.reasoning_parser, template)
        self.tool_format: ToolFormat = FORMATS[cfg.tool_call_parser] if cfg.tool_call_parser else detect_format(template)
        self.chat_template_kwargs: dict[str, Any] = json.loads(cfg.default_chat_template_kwargs or "{}")
        self.validator.reasoning_parser = self.reasoning_parser

    def check_invariants(self) -> None:
        """Asserts the KV memory invariant (free + tree + live requests = pool) on the scheduler thread."""
        self._thread.query(self.scheduler.check_invariants)

    def stats(self) -> dict[str, float]:
        return self._thread.query(self.scheduler.stats)

    def expert_load(self) -> torch.Tensor:
        """[MoE layers, experts]: tokens the routers sent to each expert since the last rebalance."""
        self._require_moe()
        return self._thread.query(self.runner.expert_load)

    def rebalance_experts(self, num_physical: int, num_ranks: int | None = None, num_groups: int = 1,
                          num_nodes: int = 1) -> list[Placement]:
        """EPLB: places every MoE layer's experts by its measured load (hot ones replicated) and applies it
        on every rank. `num_ranks`: the expert-parallel ranks the placement balances (default: the
        engine's; under expert parallelism it must be that)."""
        def place() -> list[Placement]:
            self._require_moe()
            ep = self.runner.ep_size
            if num_ranks is not None and ep > 1 and num_ranks != ep:
                raise ValueError(f"num_ranks must be the engine's ep_size {ep} under expert parallelism")
            placements = plan_rebalance(self.runner.expert_load(), num_physical, num_ranks or ep, num_groups,
                                        num_nodes)
            self.runner.place_experts(placements)
            return placements

        return self._thread.query(place)

    def _require_moe(self) -> None:
        if not moe_blocks(self.runner.model):
            raise ValueError("this model has no mixture-of-experts layers")

    def shutdown(self) -> None:
        """Aborts what is still in flight, stops the scheduler thread and cancels a background compile that
        still runs (a process that exits with it inside the compiler aborts)."""
        self._thread.stop()
        if self.decode_compile is not None:
            self.decode_compile.stop()
        self.runner.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
