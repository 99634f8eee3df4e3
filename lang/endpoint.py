"""The HTTP backend: a client of a radixlang (or SGLang) server's native API.

It uses POST /generate (text or input_ids, image_data as data URLs, sampling_params, return_logprob,
logprob_start_len, top_logprobs_num, stream as server-sent events whose `text` is cumulative, or new
text only where /get_server_info says `incremental_streaming_output`), GET /get_model_info
(model_path; chat_template / bos_token / eos_token for roles; image_token, the placeholder a vision
model's prompt has where each image goes), POST /flush_cache, and
POST /v1/programs for `run(remote=True)`. Only the standard library is used.
"""
from __future__ import annotations

import http.client
import json
import os
import threading
import urllib.error
import urllib.request
from typing import Any, Generator, Iterator

from .backend import PREFILL_ONLY, GenDelta, StateView
from .chat import ChatTemplate
from .choices import ChoiceMethod, decide, resolve_method
from .config import HTTP_TIMEOUT_S, SELECT_HEAL_WINDOW
from .images import image_data_url
from .ir import Gen
from .ir_json import ProgramIR

API_KEY_ENV = "RADIXLANG_API_KEY"  # the key an Endpoint sends when given none (server/auth.py reads the same)


class Endpoint:
    def __init__(self, base_url: str, *, api_key: str | None = None, timeout: float = HTTP_TIMEOUT_S,
                 chat_template: str | None = None):
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http:// or https:// URL, got {base_url!r}")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.base_url = base_url.rstrip("/")
        # sent as `Authorization: Bearer` (a server started with --api-key); by default $RADIXLANG_API_KEY's
        self.api_key = api_key if api_key is not None else os.environ.get(API_KEY_ENV) or None
        self.timeout = timeout
        self._chat_template = chat_template
        self._info: dict[str, Any] | None = None
        self._router: bool | None = None  # behind_router(), once asked
        self._incremental: bool | None = None  # incremental_streams(), once asked
        self._lock = threading.Lock()

    # ---- HTTP ---------------------------------------------------------------------------------------
    def _open(self, path: str, payload: object = None) -> http.client.HTTPResponse:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(self.base_url + path, data=data, headers=headers,
                                         method="GET" if payload is None else "POST")
        try:
            return urllib.request.urlopen(request, timeout=self.timeout)
        except urllib.error.HTTPError as e:
            raise _http_error(e.code, e.read()) from None
        except urllib.error.URLError as e:
            raise ConnectionError(f"cannot reach {self.base_url}: {e.reason}") from None

    def _json(self, path: str, payload: object = None) -> Any:  # noqa: ANN401 - the route's JSON reply, any shape
        with self._open(path, payload) as response:
            return json.loads(response.read())

    def _events(self, path: str, payload: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The JSON objects of a server-sent event stream, until `[DONE]` or its end."""
        with self._open(path, {**payload, "stream": True}) as response:
            for raw in response:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    return
                event = json.loads(data)
                if isinstance(event, dict) and "error" in event and "event" not in event:  # the stream failed
                    error = event["error"]
                    code = error.get("code") if isinstance(error, dict) else None
                    raise _http_error(code if isinstance(code, int) else 500, data)
                yield event

    def model_info(self) -> dict[str, Any]:
        """GET /get_model_info, once ({} if the server has no such route)."""
        with self._lock:
            if self._info is None:
                try:
                    self._info = self._json("/get_model_info")
                except ValueError:  # a 4xx: not served
                    self._info = {}
            return self._info

    # ---- Backend protocol ---------------------------------------------------------------------------
    def chat_template(self) -> ChatTemplate:
        info = self.model_info()
        template = self._chat_template or info.get("chat_template")
        if not template:
            raise ValueError(f"the server at {self.base_url} exposes no chat template (GET /get_model_info); "
                             "pass Endpoint(url, chat_template=...) to use roles")
        from ..runtime.tokenizer import render_chat_template

        specials = {"bos_token": info.get("bos_token") or "", "eos_token": info.get("eos_token") or ""}
        return ChatTemplate(lambda messages, add_generation_prompt: render_chat_template(
            template, messages, add_generation_prompt, **specials))

    def cache_prefix(self, text: str) -> None:
        if text:
            self._json("/generate", {"text": text, "sampling_params": PREFILL_ONLY})

    def flush_cache(self) -> bool:
        self._json("/flush_cache", {})
        return True

    # ---- SGLang's RuntimeEndpoint / Runtime names ------------------------------------------------------
    @property
    def endpoint(self) -> "Endpoint":
        """SGLang reads `backend.endpoint` of a Runtime; an Endpoint is its own."""
        return self

    def get_model_name(self) -> str | None:
        """The served model's path (SGLang's RuntimeEndpoint.get_model_name)."""
        return self.model_info().get("model_path")

    def get_server_info(self) -> dict[str, Any]:
        return self._json("/server_info")

    def incremental_streams(self) -> bool:
        """Whether the server streams only what is new in each event (SGLang's incremental_streaming_output)."""
        if self._incremental is None:
            try:
                self._incremental = self.get_server_info().get("incremental_streaming_output") is True
            except ValueError:  # a 4xx: no such route, so SGLang's default
                self._incremental = False
        return self._incremental

    def generate(self, state: StateView, gen: Gen) -> Generator[GenDelta, None, None]:
        text, images = self._prompt(state)
        if not text:
            raise ValueError(f"gen {gen.name!r} has no text before it to condition on")
        p = gen.params
        payload: dict[str, Any] = {"text": text, **images, "sampling_params": p.sampling_params()}
        if p.lora is not None:
            payload["lora_path"] = p.lora  # SGLang's field: the adapter's name
        if payload["sampling_params"].get("grammar") is not None and self.behind_router():
            raise ValueError(f"gen {gen.name!r} has a grammar, which SGLang's router drops on the way to a worker "
                             "(it would run unconstrained): run it against a worker's URL")
        if p.return_logprob or p.top_logprobs_num:
            payload.update(return_logprob=True, top_logprobs_num=p.top_logprobs_num or 0,
                           return_text_in_logprobs=bool(p.return_text_in_logprobs))
            if p.logprob_start_len is not None:
                payload["logprob_start_len"] = p.logprob_start_len
        sent, last, reported = 0, None, 0
        for event in _cumulative(self._events("/generate", payload), self.incremental_streams()):
            text = event.get("text", "")
            progress = dict(event.get("meta_info") or {})
            for key in ("output_token_logprobs", "output_top_logprobs"):  # the stream's lists are cumulative
                if key in progress:
                    progress[key] = progress[key][reported:]
            reported += len(progress.get("output_token_logprobs") or ())
            yield GenDelta(text[sent:], progress=progress)
            sent = max(sent, len(text))
            last = event
        if last is None:
            raise RuntimeError("the server's stream ended without a result")
        meta = dict(last.get("meta_info") or {})
        reason = meta.get("finish_reason")
        meta["finish_reason"] = reason = reason if isinstance(reason, dict) else {"type": reason}
        if reason.get("type") == "abort":
            raise RuntimeError(f"gen {gen.name!r} was aborted: {reason.get('message') or meta.get('error')}")
        yield GenDelta("", meta)

    def select(self, state: StateView, choices: list[str], method: str | ChoiceMethod) -> tuple[int, dict[str, Any]]:
        """As the engine backend's select, without a local tokenizer: the server scores the prefix and
        every prefix + choice from a window before the prefix's end, and the first position where
        a choice's tokens differ from the prefix's is where healing starts."""
        method = resolve_method(method)
        prefix, images = self._prompt(state)
        if not prefix:
            raise ValueError("select needs text before it to condition on")
        prompt_tokens = self._json("/generate", {"text": prefix, **images, "sampling_params": PREFILL_ONLY}
                                   )["meta_info"]["prompt_tokens"]  # images expanded: the positions scores name
        given, floor = self._window_bounds(state, prefix, prompt_tokens)
        window_start = max(given - SELECT_HEAL_WINDOW, floor, 1)
        prompts = [prefix] + [prefix + c for c in choices]
        batch = {"text": prompts, **({"image_data": [images["image_data"]] * len(prompts)} if images else {})}
        while True:
            rows, cached = self._score(batch, window_start)
            lowest = min(rows[0])  # the first prefix position the server reported
            start = min(_divergence(rows[0], row, prompt_tokens) for row in rows[1:])
            if start > lowest:
                break
            if window_start == floor:
                raise ValueError("select needs more text before it: the choices merge with the prompt's first "
                                 "token" if floor == 0 else "select needs more text after the last image: the "
                                 "choices merge with the text right after it")
            window_start = floor  # healing may reach past the window: look at the whole prompt
        scored = [[row[i] for i in sorted(row) if i >= start] for row in rows[1:]]
        unconditional = None
        if getattr(method, "requires_unconditional_logprobs", False):
            tails = [[e[1] for e in entries] for entries in scored]
            alone, _ = self._score({"input_ids": tails}, 0)
            unconditional = [[(None, tail[0], None)] + [row[i] for i in sorted(row) if i >= 1]
                             for tail, row in zip(tails, alone)]
        index, meta = decide(method, choices, scored, unconditional)
        meta["cached_tokens"] = cached[1:]
        return index, meta

    def _score(self, prompts: dict[str, Any], start: int) -> tuple[list[dict[int, tuple]], list[int]]:
        """Prefill-only scoring of a batch (`{"text": [...]}` or `{"input_ids": [...]}`) from `start`."""
        body = {"sampling_params": PREFILL_ONLY, "return_logprob": True, "logprob_start_len": start}
        if "text" in prompts and self.behind_router():  # the router takes one text per /generate
            images = prompts.get("image_data") or [None] * len(prompts["text"])
            outs = [self._json("/generate", {**body, "text": text, **({"image_data": i} if i else {})})
                    for text, i in zip(prompts["text"], images)]
        else:
            outs = self._json("/generate", {**prompts, **body})
        return [_positioned(o["meta_info"]) for o in outs], [o["meta_info"].get("cached_tokens", 0) for o in outs]

    def _window_bounds(self, state: StateView, prefix: str, prompt_tokens: int) -> tuple[int, int]:
        """(prompt tokens as sent, the first of them scoring may start at). `logprob_start_len` counts
        tokens as sent, each image placeholder one token; a prompt may not be scored from before its last
        image. Without images both are known already; with them, the server's tokenizer says."""
        if not state.images:
            return prompt_tokens, 0
        given = self._json("/tokenize", {"prompt": prefix})["count"]
        after = self._json("/tokenize", {"prompt": state.text[state.image_offsets[-1]:],
                                         "add_special_tokens": False})["count"]
        return given, given - after

    def _prompt(self, state: StateView) -> tuple[str, dict[str, Any]]:
        """The prompt text, with the server model's image placeholder where each image goes, and the
        images as /generate's `image_data` (empty without images)."""
        if not state.images:
            return state.text, {}
        placeholder = self.model_info().get("image_token")
        if not placeholder:
            raise ValueError(f"this program sends {len(state.images)} image(s), but the server at "
                             f"{self.base_url} names no image placeholder (GET /get_model_info has no "
                             "image_token): its model takes no images")
        return state.with_placeholders(placeholder), {"image_data": [image_data_url(i) for i in state.images]}

    def behind_router(self) -> bool:
        """Whether base_url is SGLang's router (it lists its workers at GET /workers), once."""
        with self._lock:
            if self._router is None:
                try:
                    self._router = isinstance(self._json("/workers").get("workers"), list)
                except (ValueError, RuntimeError, AttributeError):  # a 4xx, or not the router's answer
                    self._router = False
            return self._router

    def run_program(self, ir: ProgramIR, args: dict[str, Any], sampling: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Runs an IR program on the server (POST /v1/programs); yields its events as dicts."""
        if self.behind_router():
            raise ValueError(f"{self.base_url} is SGLang's router, which does not forward /v1/programs: run the "
                             "program with remote=False (one call per primitive, each routed to the worker that "
                             "caches its prefix), or with remote=True against one worker's URL")
        payload = {"program": ir.to_dict(), "args": args,
                   "sampling_params": {k: v for k, v in sampling.items() if v is not None}}
        return self._events("/v1/programs", payload)

    def __repr__(self) -> str:
        return f"Endpoint({self.base_url!r})"


RuntimeEndpoint = Endpoint  # SGLang's name


def _cumulative(events: Iterator[dict[str, Any]], incremental: bool) -> Iterator[dict[str, Any]]:
    """Stream events as a default SGLang stream sends them (text and output logprobs so far), from an
    incremental one's (only what is new)."""
    if not incremental:
        yield from events
        return
    text, so_far = "", dict[str, list[Any]]()
    for event in events:
        text += event.get("text", "")
        meta = dict(event.get("meta_info") or {})
        for key in ("output_token_logprobs", "output_top_logprobs"):
            if key in meta:
                meta[key] = so_far.setdefault(key, [])  # one list, grown: the caller slices what is new
                meta[key].extend(event["meta_info"][key])
        yield {**event, "text": text, "meta_info": meta}


def _positioned(meta: dict[str, Any]) -> dict[int, tuple]:
    """A prompt's token log-probability entries keyed by token position (they cover its last tokens)."""
    entries = [tuple(e) + (None,) * (3 - len(e)) for e in meta.get("input_token_logprobs") or []]
    first = meta["prompt_tokens"] - len(entries)
    return {first + i: (e[0], e[1], e[2]) for i, e in enumerate(entries) if e[0] is not None or first + i == 0}


def _divergence(prefix: dict[int, tuple], row: dict[int, tuple], prompt_tokens: int) -> int:
    """The first position where `row`'s tokens differ from the prefix's (prompt_tokens if none do)."""
    for pos in sorted(prefix):
        if pos not in row or row[pos][1] != prefix[pos][1]:
            return pos
    return prompt_tokens


def _http_error(code: int, body: bytes) -> Exception:
    try:
        detail: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        detail = body.decode(errors="replace")
    if isinstance(detail, dict):
        detail = detail.get("error") or detail.get("detail") or detail.get("message") or detail
        if isinstance(detail, dict):
            detail = detail.get("message") or detail
    message = f"server answered {code}: {detail}"
    if code in (401, 403):  # not a bad request: this client's key (api_key=, $RADIXLANG_API_KEY) is refused
        return PermissionError(message)
    return ValueError(message) if 400 <= code < 500 else RuntimeError(message)
