"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions (streaming or not)."""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ..runtime.engine import Completion
from ..runtime.execution.sampler import TokenLogprob
from ..runtime.reasoning_formats import ReasoningFormat
from ..runtime.request import StreamChunk
from ..runtime.sampling_params import CONSTRAINT_FIELDS, RULES
from .auth import tenant_of
from .config import COMPLETIONS_DEFAULT_MAX_TOKENS
from .errors import APIError, user_errors
from .logprobs import TextOffsets, chat_logprobs, completion_logprobs
from .openai_params import (
    FIELDS,
    Job,
    chat_prompt,
    check_model,
    check_top_logprobs,
    completion_prompts,
    new_id,
    num_prompts,
)
from .openapi import error_responses, streaming_responses
from .protocol import ChatCompletionRequest, CompletionRequest, ResponseFormat, SamplingFields
from .reasoning import (
    ReasoningStream,
    default_max_tokens,
    reasoning_params,
    reply_format,
    request_parser,
    split_reply,
    template_kwargs,
)
from .serving import events, run
from .sglang_fields import check_chat_extras, check_completion_extras
from .state import ServerState, server_state
from .streaming import sse_response
from .text_input import check_unicode_tree
from .tool_calls import ToolPlan, ToolStream, plan_tools, reply_message

router = APIRouter()


@router.get("/v1/models", responses=error_responses(503))
async def models(request: Request) -> dict[str, Any]:
    state = server_state(request)
    base = {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "radixlang",
            "max_model_len": state.engine.context_length}
    # each LoRA adapter as a model of its own, its parent the base (vLLM's listing); `root` its folder
    adapters = [base | {"id": name, "parent": state.model_name, "root": path}
                for name, path in sorted(state.engine.lora_adapters().items())]
    return {"object": "list", "data": [base | {"parent": None, "root": state.engine.model_path}, *adapters]}


# ---- sampling params: the route's fields in the engine's names (validated once, in _respond) -------
# the route's max_tokens field and default (max_completion_tokens on chat), and response_format, set these
_SET_BY_ROUTE = ("max_new_tokens", "json_schema", "json_schema_strict", "structural_tag")


def sampling_params(req: SamplingFields, max_new_tokens: int) -> dict[str, Any]:
    """Engine sampling params; response_format / regex / grammar / ebnf become constrained decoding."""
    if req.stream_options is not None and not req.stream:
        raise APIError(400, "stream_options is only allowed with stream=true", "stream_options")
    params: dict[str, Any] = {"max_new_tokens": max_new_tokens}
    params |= {name: value for name in RULES if name not in _SET_BY_ROUTE
               and (value := getattr(req, FIELDS[name])) is not None}
    fmt = req.response_format
    if fmt is not None and fmt.type == "structural_tag":
        params["structural_tag"] = fmt.model_dump(exclude_none=True, include={"type", "structures", "triggers", "format"})
    elif (schema := _response_format_schema(fmt)) is not None:
        params["json_schema"] = schema
        if fmt is not None and fmt.json_schema is not None and fmt.json_schema.strict:
            params["json_schema_strict"] = True  # OpenAI's strict: declared order, closed objects
    constraints = [k for k in CONSTRAINT_FIELDS if k in params]
    if len(constraints) > 1:
        raise APIError(400, "use at most one of response_format (JSON), regex, grammar and ebnf",
                       FIELDS[constraints[1]])
    return params


def _response_format_schema(fmt: ResponseFormat | None) -> str | None:
    """The JSON schema (as a JSON string, like SGLang's json_schema) that a response_format asks for."""
    if fmt is None or fmt.type in ("text", "structural_tag"):
        return None
    if fmt.type == "json_object":
        return json.dumps({"type": "object"})
    assert fmt.json_schema is not None  # the model validator guarantees it
    return json.dumps(fmt.json_schema.schema_)


# ---- usage ----------------------------------------------------------------------------------------
@dataclass
class Usage:
    """Token counts of a request: each prompt counts once, however many samples it has."""

    job: Job
    completion_tokens: int = 0
    cached: dict[int, int] = field(default_factory=dict)  # prompt -> cached tokens (its first sample)
    # prompt -> its tokens as the engine ran them: each image placeholder expanded to its feature rows
    prompt_tokens: dict[int, int] = field(default_factory=dict)

    def add(self, index: int, completion_tokens: int, cached_tokens: int, prompt_tokens: int) -> None:
        self.completion_tokens += completion_tokens
        self.cached.setdefault(index // self.job.n, cached_tokens)
        self.prompt_tokens.setdefault(index // self.job.n, prompt_tokens)

    def body(self) -> dict[str, Any]:
        prompt = sum(self.prompt_tokens.get(i, len(p)) for i, p in enumerate(self.job.prompts))
        return {"prompt_tokens": prompt, "completion_tokens": self.completion_tokens,
                "total_tokens": prompt + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": sum(self.cached.values())}}


@dataclass
class _View:
    """Renders one OpenAI request's choices: whole (`choice`) or as stream events (`start`, `render`
    per engine chunk, `finish`). Subclasses name the objects and shape a choice."""

    state: ServerState
    body: CompletionRequest | ChatCompletionRequest
    job: Job
    kind: ClassVar[str]  # object type of a whole response
    chunk_kind: ClassVar[str]  # object type of a stream event

    def __post_init__(self) -> None:
        self.usage = Usage(self.job)

    def choice(self, k: int, c: Completion) -> dict[str, Any]:
        raise NotImplementedError

    def start(self) -> list[dict]:
        return []

    def render(self, k: int, chunk: StreamChunk) -> list[dict]:
        raise NotImplementedError

    @property
    def include_usage(self) -> bool:
        return self.body.stream_options is not None and self.body.stream_options.include_usage

    def finish(self) -> list[dict]:
        """With stream_options.include_usage, a last event with no choices carries the usage."""
        return [self._event([]) | {"usage": self.usage.body()}] if self.include_usage else []

    def _event(self, choices: list[dict]) -> dict[str, Any]:
        obj = {"id": self.job.id, "object": self.chunk_kind, "created": self.job.created,
               "model": self.body.model, "choices": choices}
        return obj | {"usage": None} if self.include_usage else obj

    def whole(self, results: list[Completion]) -> dict[str, Any]:
        usage = Usage(self.job)
        for k, c in enumerate(results):
            usage.add(k, c.meta.completion_tokens, c.meta.cached_tokens, c.meta.prompt_tokens)
        return {"id": self.job.id, "object": self.kind, "created": self.job.created, "model": self.body.model,
                "choices": [self.choice(k, c) for k, c in enumerate(results)], "usage": usage.body()}


async def _respond(request: Request, view: _View, params: dict[str, Any], fields: dict[str, str]) -> Response:
    """Validates the request once (on the CPU pool: a constraint compiles there), then runs or streams it."""
    state, job = view.state, view.job
    tenant = tenant_of(request)
    for name, value in params.items():  # e.g. a stop string comes back in matched_stop
        check_unicode_tree(value, fields.get(name, name))
    build = functools.partial(
        state.engine.validator.build, input_ids=job.prompts, sampling_params=params, return_logprob=job.return_logprob,
        logprob_start_len=job.logprob_start_len, top_logprobs_num=job.top_logprobs_num, rid=job.rids,
        image_data=job.image_data, retain=job.cache_key and tenant.scoped(job.cache_key), priority=job.priority,
        names=fields | {"lora": "model"}, namespace=tenant.namespace, lora=job.lora)
    with user_errors(fields):
        batch = await state.offload(build)
    state.limits.check_sequences(len(job.prompts), batch.n)
    job.n = batch.n
    groups = {job.id: batch.rids}  # all samples abort together by the response id
    if view.body.stream:
        state.live.check(groups)  # a clash is still a 4xx status, before the stream starts
        chunks = state.engine.async_chunks(batch)
        return sse_response(events(state, groups, chunks, view.render, view.start(), view.finish,
                                   job.return_logprob, tenant.id))
    results = await run(state, request, state.engine.async_run(batch), groups)
    return JSONResponse(await state.offload(view.whole, results))  # logprobs: many detokenisations


# ---- /v1/completions ------------------------------------------------------------------------------
@router.post("/v1/completions", responses=streaming_responses(400, 404, 413, 503))
async def completions(body: CompletionRequest, request: Request) -> Response:
    state = server_state(request)
    state.ensure_open()
    lora = check_model(body.model, state.model_name, state.engine.lora_adapters(), body.lora_path)
    check_completion_extras(body)
    if body.best_of is not None and body.best_of != body.n:
        raise APIError(400, "best_of is not supported; use n for several samples", "best_of")
    if body.suffix is not None:
        raise APIError(400, "suffix is not supported", "suffix")
    check_top_logprobs(body.logprobs, "logprobs")
    max_tokens = COMPLETIONS_DEFAULT_MAX_TOKENS if body.max_tokens is None else body.max_tokens
    params = sampling_params(body, max_tokens)
    fields = FIELDS | {"top_logprobs_num": "logprobs"}
    state.limits.check_prompts(num_prompts(body.prompt), "prompt")
    engine = state.engine
    prompts, texts = await state.offload(completion_prompts, engine.tokenizer, body.prompt, engine.context_length)
    want_logprobs = body.logprobs is not None
    job = Job(new_id("cmpl"), prompts, return_logprob=want_logprobs, top_logprobs_num=body.logprobs or 0,
              logprob_start_len=0 if body.echo and want_logprobs else -1,  # echo scores the prompt too
              cache_key=body.prompt_cache_key, priority=body.priority or 0, lora=lora)
    return await _respond(request, _CompletionView(state, body, job, texts), params, fields)


@dataclass
class _CompletionView(_View):
    body: CompletionRequest
    texts: list[str] | None = None  # the prompts, when given as text (for echo)
    offsets: dict[int, TextOffsets] = field(default_factory=dict)  # per choice, across its events
    started: set[int] = field(default_factory=set)  # choices whose first event went out
    kind: ClassVar[str] = "text_completion"
    chunk_kind: ClassVar[str] = "text_completion"

    def echo_text(self, p: int) -> str:
        if self.texts is not None:
            return self.texts[p]
        return self.state.engine.tokenizer.decode(self.job.prompts[p], skip_special_tokens=False)

    def _piece(self, k: int, text: str, ids: list[int], lps: list[TokenLogprob | None],
               input_lps: list[TokenLogprob] | None, first: bool) -> dict[str, Any]:
        """Text and logprobs of a run of choice k's tokens; its first run carries the echoed prompt."""
        p = k // self.job.n
        if first and self.body.echo:
            text = self.echo_text(p) + text
            if self.job.return_logprob:
                ids = self.job.prompts[p] + ids
                lps = [None, *(input_lps or []), *lps]
        logprobs = None
        if self.job.return_logprob:
            offsets = self.offsets.setdefault(k, TextOffsets(self.state.engine.tokenizer))
            logprobs = completion_logprobs(self.state.engine.tokenizer, ids, lps, offsets)
        return {"index": k, "text": text, "logprobs": logprobs}

    def choice(self, k: int, c: Completion) -> dict[str, Any]:
        piece = self._piece(k, c.text, c.output_ids, list(c.meta.output_logprobs or []),
                            c.meta.input_logprobs, True)
        return piece | {"finish_reason": c.meta.finish_reason, "matched_stop": c.meta.matched_stop}

    def render(self, k: int, chunk: StreamChunk) -> list[dict]:
        first = k not in self.started
        self.started.add(k)
        piece = self._piece(k, chunk.text, chunk.token_ids, list(chunk.logprobs), chunk.input_logprobs, first)
        if chunk.finished:
            self.usage.add(k, chunk.completion_tokens, chunk.cached_tokens, chunk.prompt_tokens)
            piece |= {"finish_reason": chunk.finish_reason, "matched_stop": chunk.matched_stop}
        elif not piece["text"] and piece["logprobs"] is None:
            return []  # text held back (a partial character or stop string) and nothing else to say
        else:
            piece["finish_reason"] = None
        return [self._event([piece])]


# ---- /v1/chat/completions -------------------------------------------------------------------------
@router.post("/v1/chat/completions", responses=streaming_responses(400, 404, 413, 503))
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    return await chat_response(body, request)


async def chat_response(body: ChatCompletionRequest, request: Request,
                        adapt: Callable[[_ChatView], _View] | None = None) -> Response:
    """Runs a chat request; `adapt` wraps its view to answer in another protocol's shape (server/agent_views.py)."""
    state = server_state(request)
    state.ensure_open()
    lora = check_model(body.model, state.model_name, state.engine.lora_adapters(), body.lora_path)
    check_chat_extras(body)
    check_top_logprobs(body.top_logprobs, "top_logprobs")
    if body.top_logprobs and not body.logprobs:
        raise APIError(400, "top_logprobs needs logprobs=true", "top_logprobs")
    engine = state.engine
    max_name = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    if max_tokens is None:  # a bounded default (engine option default_max_tokens), not the whole context
        max_tokens = default_max_tokens(engine.config.default_max_tokens, engine.context_length)
    params = sampling_params(body, max_tokens)
    parser = request_parser(params.pop("reasoning_parser", None), engine.reasoning_parser, "reasoning_parser")
    params |= reasoning_params(parser, params.pop("thinking_token_budget", None))
    plan = await state.offload(plan_tools, body, engine.tokenizer.chat_template,
                               lambda tag: engine.constraints.compile("structural_tag", tag), engine.tool_format)
    if plan is not None and plan.structural_tag is not None:
        params["structural_tag"] = plan.structural_tag
    fields = FIELDS | {"max_new_tokens": max_name, "top_logprobs_num": "top_logprobs", "input_ids": "messages"}
    extra = template_kwargs(engine.chat_template_kwargs, body.chat_template_kwargs)
    prompt, images = await state.offload(chat_prompt, engine.tokenizer, body.messages, engine.context_length,
                                         engine.image_prompts, state.model_name, plan, extra)
    job = Job(new_id("chatcmpl"), [prompt], return_logprob=body.logprobs,
              top_logprobs_num=body.top_logprobs or 0, image_data=images or None, cache_key=body.prompt_cache_key,
              priority=body.priority or 0, lora=lora)
    split = reply_format(parser, engine.tokenizer, prompt) if body.separate_reasoning else None
    view = _ChatView(state, body, job, plan, split)
    return await _respond(request, adapt(view) if adapt is not None else view, params, fields)


@dataclass
class _ChatView(_View):
    body: ChatCompletionRequest
    tools: ToolPlan | None = None  # with tools: calls come back as tool_calls
    reasoning: ReasoningFormat | None = None  # with a reasoning parser: the thinking as reasoning_content
    tool_streams: dict[int, ToolStream] = field(default_factory=dict)  # per choice, across its events
    reasoning_streams: dict[int, ReasoningStream] = field(default_factory=dict)
    kind: ClassVar[str] = "chat.completion"
    chunk_kind: ClassVar[str] = "chat.completion.chunk"

    def _logprobs(self, lps: list[TokenLogprob] | None) -> dict[str, Any] | None:
        return chat_logprobs(self.state.engine.tokenizer, lps or []) if self.body.logprobs else None

    def choice(self, k: int, c: Completion) -> dict[str, Any]:
        reasoning, text = split_reply(self.reasoning, c.text)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        reason: str | None = c.meta.finish_reason
        if self.tools is not None and self.tools.parses:
            message, reason = reply_message(self.tools, text, reason)
        if self.reasoning is not None:
            message["reasoning_content"] = reasoning
        return {"index": k, "message": message, "logprobs": self._logprobs(c.meta.output_logprobs),
                "finish_reason": reason, "matched_stop": c.meta.matched_stop}

    def start(self) -> list[dict]:
        """Each choice's first event names the assistant role, as OpenAI's stream does."""
        return [self._event([{"index": k, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None}])
                for k in range(len(self.job.prompts) * self.job.n)]

    def render(self, k: int, chunk: StreamChunk) -> list[dict]:
        text, reason = chunk.text, chunk.finish_reason
        reasoning = ""
        if self.reasoning is not None:
            thinking = self.reasoning_streams.setdefault(
                k, ReasoningStream(self.reasoning, hold_reasoning=not self.body.stream_reasoning))
            reasoning, text = thinking.feed(text, chunk.finished)
        calls: list[dict[str, Any]] = []
        if self.tools is not None and self.tools.parses:
            stream = self.tool_streams.setdefault(k, ToolStream(self.tools))
            text, calls = stream.feed(text, chunk.finished)
            reason = stream.finish_reason(reason)
        delta: dict[str, Any] = {"reasoning_content": reasoning} if reasoning else {}
        delta |= {"content": text} if text else {}
        if calls:
            delta["tool_calls"] = calls[:1]
        choice: dict[str, Any] = {"index": k, "delta": delta,
                                  "logprobs": self._logprobs(chunk.logprobs) if chunk.logprobs else None,
                                  "finish_reason": None}
        # a call's arguments go in events of their own after its name, as OpenAI's stream sends them
        rest = [self._event([{"index": k, "delta": {"tool_calls": [c]}, "logprobs": None, "finish_reason": None}])
                for c in calls[1:]]
        if chunk.finished:
            self.usage.add(k, chunk.completion_tokens, chunk.cached_tokens, chunk.prompt_tokens)
            if rest:
                return [self._event([choice]), *rest, self._event([
                    {"index": k, "delta": {}, "logprobs": None, "finish_reason": reason,
                     "matched_stop": chunk.matched_stop}])]
            choice |= {"finish_reason": reason, "matched_stop": chunk.matched_stop}
        elif not delta and choice["logprobs"] is None:
            return []
        return [self._event([choice]), *rest]
