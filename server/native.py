"""SGLang's native POST /generate: text or input_ids (one or a batch), sampling_params, logprobs, SSE."""
from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, AsyncGenerator, AsyncIterator

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from ..runtime.completion import Collector, Completion
from ..runtime.constrained.compiler import unenforced
from ..runtime.engine import Engine
from ..runtime.meta_info import meta_info
from ..runtime.reasoning_formats import reasoning_format
from ..runtime.request import StreamChunk
from ..runtime.sampling_params import ALIASES, SamplingParams
from .auth import tenant_of
from .errors import APIError, user_errors
from .image_input import prepare_images
from .openapi import error_responses, streaming_responses
from .protocol import DetokenizeRequest, GenerateRequest, SeparateReasoningRequest, TokenizeRequest
from .reasoning import reply_format, request_parser, split_reply
from .serving import events, length_hint, run
from .sglang_fields import check_generate_extras
from .state import ServerState, server_state
from .streaming import sse_response
from .text_input import check_unicode, check_unicode_tree, encode_texts

router = APIRouter()

# engine field names as a native client spells them (for error messages)
FIELDS = {name: f"sampling_params.{name}" for name in [f.name for f in dataclasses.fields(SamplingParams)]
          + list(ALIASES)} | {name: name for name in ("input_ids", "rid", "top_logprobs_num", "logprob_start_len")} | {
    "cache_key": "session", "lora": "lora_path"}


@router.post("/generate", responses=streaming_responses(400, 413, 422, 503))
async def generate(body: GenerateRequest, request: Request) -> Response:
    state = server_state(request)
    state.ensure_open()
    check_generate_extras(body)
    engine = state.engine
    for name, value in (body.sampling_params or {}).items():  # e.g. a stop string comes back in matched_stop
        check_unicode_tree(value, FIELDS.get(name, name))
    prompts, single = await _prompt_ids(state, body)
    _check_logprob_start(body.logprob_start_len, prompts)
    check_unicode_tree(body.rid, "rid")  # it comes back as the response's id
    images = await _images(state, body.image_data)
    split = _reasoning_split(engine, body)
    tenant = tenant_of(request)
    build = functools.partial(  # validated once, on the CPU pool (a constraint compiles there)
        engine.validator.build, input_ids=prompts, sampling_params=body.sampling_params,
        return_logprob=body.return_logprob, logprob_start_len=body.logprob_start_len,
        top_logprobs_num=body.top_logprobs_num, rid=body.rid, image_data=images,
        retain=body.cache_key and tenant.scoped(body.cache_key), priority=body.priority or 0, names=FIELDS,
        namespace=tenant.namespace, lora=body.lora_path)
    with user_errors(FIELDS):
        batch = await state.offload(build)
    state.limits.check_sequences(len(prompts), batch.n)
    n, max_new_tokens = batch.n, batch.requests[0].params.max_new_tokens
    relaxed = unenforced(batch.requests[0].constraint)  # one constraint per call
    groups = batch.groups()
    started = time.perf_counter()
    if body.stream:
        state.live.check(groups)  # a clash is still a 4xx status, before the stream starts
        chunks = engine.async_chunks(batch)
        interval = batch.requests[0].params.stream_interval or 1
        return sse_response(_events(state, body, prompts, n, max_new_tokens, interval, groups, chunks, started,
                                    tenant.id, split, relaxed))
    results = await run(state, request, engine.async_run(batch), groups)

    def render() -> list[dict[str, Any]]:
        return [_response(engine, body, prompts[i // n], c, True, started, max_new_tokens, split, relaxed)
                for i, c in enumerate(results)]

    items = await state.offload(render)  # logprobs of long prompts take many detokenisations
    return JSONResponse(items[0] if single and n == 1 else items)


@router.post("/tokenize", responses=error_responses(400, 413, 422))
async def tokenize(body: TokenizeRequest, request: Request) -> dict[str, Any]:
    """vLLM's route: a prompt's token ids as /generate would see them (an image placeholder is one token)."""
    state = server_state(request)
    check_unicode(body.prompt, "prompt")
    ids = await state.offload(state.engine.tokenizer.encode, body.prompt, body.add_special_tokens)
    return {"tokens": ids, "count": len(ids), "max_model_len": state.engine.context_length}


@router.post("/detokenize", responses=error_responses(400, 413, 422))
async def detokenize(body: DetokenizeRequest, request: Request) -> dict[str, Any]:
    """vLLM's route: the text of token ids."""
    state = server_state(request)
    vocab = state.engine.tokenizer.vocab_size
    bad = next((i for i, t in enumerate(body.tokens) if not 0 <= t < vocab), None)
    if bad is not None:
        raise APIError(400, f"tokens[{bad}] is {body.tokens[bad]}, not a token id in [0, {vocab})", f"tokens[{bad}]")
    return {"prompt": await state.offload(state.engine.tokenizer.decode, body.tokens, False)}


async def _prompt_ids(state: ServerState, body: GenerateRequest) -> tuple[list[list[int]], bool]:
    """Token ids of each prompt (tokenized here, as the engine would, so logprobs can name them),
    once their count is within the server's limits."""
    if body.text is not None:
        single = isinstance(body.text, str)
        texts = [body.text] if single else body.text
        state.limits.check_prompts(len(texts), "text")
        engine = state.engine
        return await state.offload(encode_texts, engine.tokenizer, texts, "text", not single,
                                   engine.context_length), single
    ids = body.input_ids
    assert ids is not None  # GenerateRequest holds text or input_ids
    single = bool(ids) and isinstance(ids[0], int)
    prompts = [ids] if single else ids
    state.limits.check_prompts(len(prompts), "input_ids")
    # a list of one prompt's ids, or the list of prompts (`single` says which): mypy cannot narrow
    # `list[int] | list[list[int]]` by its first item
    return prompts, single  # type: ignore[return-value]


async def _images(state: ServerState, data: str | list | None) -> list | None:
    """`image_data` prepared for the engine, in the shape it came in (a string becomes a list of one)."""
    if data is None:
        return None
    prompts, model = state.engine.image_prompts, state.model_name
    data = [data] if isinstance(data, str) else data
    if all(isinstance(x, list) for x in data) and data:
        names = [[f"image_data[{i}][{j}]" for j in range(len(x))] for i, x in enumerate(data)]
        flat = await state.offload(prepare_images, prompts, model, [s for x in data for s in x],
                                   [n for x in names for n in x])
        it = iter(flat)
        return [[next(it) for _ in x] for x in data]
    return await state.offload(prepare_images, prompts, model, data, [f"image_data[{i}]" for i in range(len(data))])


def _check_logprob_start(start: int, prompts: list[list[int]]) -> None:
    longest = max((len(p) for p in prompts), default=0)
    if not -1 <= start <= longest:
        raise APIError(400, f"logprob_start_len must be in [-1, {longest}] (-1: no prompt logprobs; the longest "
                            f"prompt has {longest} tokens), got {start}", "logprob_start_len")


def _reasoning_split(engine: Engine, body: GenerateRequest) -> str | None:
    """The reasoning parser that splits each reply (separate_reasoning), or None; a 400 without one."""
    if not body.separate_reasoning:
        return None
    parser = request_parser((body.sampling_params or {}).get("reasoning_parser") or None, engine.reasoning_parser,
                            "sampling_params.reasoning_parser")
    if parser is None:
        raise APIError(400, "separate_reasoning needs a reasoning parser: start the server with "
                            "--reasoning-parser, or pass sampling_params.reasoning_parser", "separate_reasoning")
    return parser


@router.post("/separate_reasoning", responses=error_responses(400, 422))
async def separate_reasoning(body: SeparateReasoningRequest, request: Request) -> dict[str, Any]:
    """SGLang's route: a finished text split into its reasoning and its answer."""
    parser = body.reasoning_parser or server_state(request).engine.reasoning_parser
    if parser is None:
        raise APIError(400, "no reasoning parser: pass reasoning_parser or start the server with --reasoning-parser",
                       "reasoning_parser")
    try:
        reasoning, text = reasoning_format(parser).split(body.text)
    except ValueError as e:
        raise APIError(400, str(e), "reasoning_parser") from None
    return {"text": text, "reasoning_text": reasoning}


def _response(engine: Engine, body: GenerateRequest, prompt_ids: list[int], c: Completion,
              finished: bool, started: float, max_new_tokens: int, split: str | None = None,
              relaxed: tuple[str, ...] = ()) -> dict[str, Any]:
    """`relaxed`: the JSON-schema keywords the request's constraint leaves unenforced (meta_info reports them)."""
    meta = meta_info(engine.tokenizer, c.meta, finished=finished, e2e_latency=time.perf_counter() - started,
                     return_logprob=body.return_logprob, with_text=body.return_text_in_logprobs,
                     prompt_ids=prompt_ids, logprob_start_len=body.logprob_start_len,
                     input_logprobs=c.meta.input_logprobs, output_logprobs=c.meta.output_logprobs,
                     weight_version=engine.weight_version)
    if relaxed:
        meta["unenforced_keywords"] = list(relaxed)
    reason = meta["finish_reason"]
    if reason is not None and reason["type"] == "length":
        hint = length_hint(engine, c.meta.prompt_tokens, c.meta.completion_tokens, max_new_tokens)
        if hint:
            reason["message"] = hint
    if split is not None:
        reasoning, answer = split_reply(reply_format(split, engine.tokenizer, prompt_ids), c.text)
        return {"text": answer, "reasoning_text": reasoning or "", "output_ids": c.output_ids, "meta_info": meta}
    return {"text": c.text, "output_ids": c.output_ids, "meta_info": meta}


# what an incremental stream event holds only the new part of (SGLang's _INCREMENTAL_STREAMING_META_INFO_KEYS)
_INCREMENTAL_META = ("output_token_logprobs", "output_top_logprobs")


def _since_last(whole: dict[str, Any], sent: dict[str, int]) -> dict[str, Any]:
    """An event as SGLang's incremental_streaming_output sends it: the text, output_ids and output logprobs
    past the lengths already `sent` (updated here); counts (completion_tokens, output_token_logprobs_length)
    stay totals."""
    meta = dict(whole["meta_info"])
    event = {"text": whole["text"][sent.get("text", 0):], "output_ids": whole["output_ids"][sent.get("ids", 0):],
             "meta_info": meta}
    sent.update(text=len(whole["text"]), ids=len(whole["output_ids"]))
    if "reasoning_text" in whole:
        event["reasoning_text"] = whole["reasoning_text"][sent.get("reasoning", 0):]
        sent["reasoning"] = len(whole["reasoning_text"])
    for key in _INCREMENTAL_META:
        if key in meta:
            meta[key] = meta[key][sent.get(key, 0):]
            sent[key] = len(whole["meta_info"][key])
    return event


def _events(state: ServerState, body: GenerateRequest, prompts: list[list[int]], n: int, max_new_tokens: int,
            interval: int, groups: dict[str, list[str]], chunks: AsyncGenerator[tuple[int, StreamChunk], None],
            started: float, owner: str, split: str | None = None,
            relaxed: tuple[str, ...] = ()) -> AsyncIterator[str]:
    """Like SGLang: each event carries the text, ids and logprobs so far, plus `index` in the batch; with
    `stream_interval` k, an event comes once k more tokens are out (and at the end). A server started with
    SGLang's incremental_streaming_output sends only what is new instead (`_since_last`)."""
    collectors: dict[int, Collector] = {}
    sent: dict[int, int] = {}  # completion tokens each sample's last event carried
    shown: dict[int, dict[str, int]] = {}  # how much of each sample's lists went out (incremental streaming)

    def render(i: int, chunk: StreamChunk) -> list[dict]:
        collector = collectors.setdefault(i, Collector())
        collector.add(chunk)
        if not chunk.finished and chunk.completion_tokens - sent.get(i, 0) < interval:  # SGLang's stream_interval
            return []
        sent[i] = chunk.completion_tokens
        c = collector.result(chunk, body.return_logprob)
        whole = _response(state.engine, body, prompts[i // n], c, chunk.finished, started, max_new_tokens, split,
                          relaxed)
        if state.incremental_streaming_output:
            return [_since_last(whole, shown.setdefault(i, {})) | {"index": i}]
        return [whole | {"index": i}]

    return events(state, groups, chunks, render, with_logprobs=body.return_logprob, owner=owner)
