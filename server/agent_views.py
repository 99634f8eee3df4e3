"""What the agent protocols (/v1/responses, /v1/messages) share: each request becomes a chat request that
the chat route runs (chat template, tools, constraints, reasoning, prompt-cache sessions), and a
`ProtocolView` reshapes what the chat view renders - a whole `chat.completion` or its stream chunks - into
the protocol's own objects and events.

Both protocols answer in content *blocks*, in order: reasoning, text, function calls. `blocks_of` reads them
from a whole chat message; `BlockStream` reads them from chat chunks as open / delta / close events, so a
protocol renders blocks once for both modes. Reasoning comes from the chat message's `reasoning_content`
(its stream's `delta.reasoning_content`): whatever the chat route separates as reasoning reaches both
protocols as reasoning / thinking blocks.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, ClassVar, Literal

from fastapi.responses import Response, StreamingResponse
from pydantic import ValidationError

from ..runtime.engine import Completion
from ..runtime.request import StreamChunk
from .errors import APIError
from .openai_api import _ChatView, _View
from .protocol import ChatCompletionRequest

BlockKind = Literal["reasoning", "text", "call"]


@dataclass
class Block:
    kind: BlockKind
    text: str = ""  # the reasoning or the text; a call's arguments (a JSON object's text)
    call_id: str = ""  # a call's id, as the chat route made it
    name: str = ""  # a call's function


@dataclass
class Ending:
    """How a reply ended and what it cost."""

    finish_reason: str | None = None  # the chat route's: stop, length, tool_calls, abort
    matched_stop: str | int | None = None  # the stop string (or token id) that ended it
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # of prompt_tokens, those the radix cache already held


@dataclass
class BlockEvent:
    action: Literal["open", "delta", "close"]
    index: int  # the block's position in the reply
    block: Block  # as far as it has come
    piece: str = ""  # a delta's new text


def blocks_of(message: dict[str, Any]) -> list[Block]:
    """The blocks of a whole chat message; at least one (an empty text), as both protocols answer."""
    blocks = []
    if message.get("reasoning_content"):
        blocks.append(Block("reasoning", message["reasoning_content"]))
    if message.get("content"):
        blocks.append(Block("text", message["content"]))
    for call in message.get("tool_calls") or []:
        blocks.append(Block("call", call["function"]["arguments"], call["id"], call["function"]["name"]))
    return blocks or [Block("text")]


def usage_ending(ending: Ending, usage: dict[str, Any]) -> Ending:
    ending.prompt_tokens = usage["prompt_tokens"]
    ending.completion_tokens = usage["completion_tokens"]
    ending.cached_tokens = usage["prompt_tokens_details"]["cached_tokens"]
    return ending


@dataclass
class BlockStream:
    """Chat chunk events (`_ChatView.render`'s) -> block events: a block opens on its first delta and
    closes when the next opens or the reply ends. Chat streams a call as a delta with its id and name,
    then one with its arguments."""

    blocks: list[Block] = field(default_factory=list)
    open_index: int | None = None
    calls: dict[int, int] = field(default_factory=dict)  # the chat's tool call index -> block index
    ending: Ending = field(default_factory=Ending)

    def feed(self, event: dict[str, Any]) -> list[BlockEvent]:
        out: list[BlockEvent] = []
        for choice in event.get("choices", []):
            delta = choice.get("delta", {})
            if delta.get("reasoning_content"):
                out += self._text("reasoning", delta["reasoning_content"])
            if delta.get("content"):
                out += self._text("text", delta["content"])
            for call in delta.get("tool_calls") or []:
                out += self._call(call)
            if choice.get("finish_reason") is not None:
                self.ending.finish_reason = choice["finish_reason"]
                self.ending.matched_stop = choice.get("matched_stop")
        if event.get("usage"):
            usage_ending(self.ending, event["usage"])
        return out

    def end(self) -> list[BlockEvent]:
        """Closes the open block (an empty text when the reply had none)."""
        out = [] if self.blocks else self._open(Block("text"))
        if self.open_index is not None:
            out.append(BlockEvent("close", self.open_index, self.blocks[self.open_index]))
            self.open_index = None
        return out

    def _open(self, block: Block) -> list[BlockEvent]:
        out = self.end() if self.open_index is not None else []
        self.blocks.append(block)
        self.open_index = len(self.blocks) - 1
        return [*out, BlockEvent("open", self.open_index, block)]

    def _text(self, kind: BlockKind, piece: str) -> list[BlockEvent]:
        current = self.blocks[self.open_index] if self.open_index is not None else None
        out = [] if current is not None and current.kind == kind else self._open(Block(kind))
        block = self.blocks[self.open_index]  # type: ignore[index]  # _open set it
        block.text += piece
        return [*out, BlockEvent("delta", len(self.blocks) - 1, block, piece)]

    def _call(self, call: dict[str, Any]) -> list[BlockEvent]:
        fn = call.get("function", {})
        if "id" in call:  # a new call: its id and name
            out = self._open(Block("call", "", call["id"], fn.get("name", "")))
            self.calls[call["index"]] = len(self.blocks) - 1
            return out
        index = self.calls[call["index"]]
        block = self.blocks[index]
        block.text += fn.get("arguments", "")
        return [BlockEvent("delta", index, block, fn.get("arguments", ""))]


@dataclass
class ProtocolView(_View):
    """Answers a chat request in another protocol's shape. Subclasses say how: `whole_body` for a whole
    reply, `opening` / `on_block` / `closing` for a stream's events, each a dict with a "type"."""

    inner: _ChatView = field(kw_only=True)
    blocks: BlockStream = field(default_factory=BlockStream, kw_only=True)
    kind: ClassVar[str] = ""
    chunk_kind: ClassVar[str] = ""

    @classmethod
    def adapter(cls, **fields: Any) -> Callable[[_ChatView], _View]:  # noqa: ANN401 - the subclass's own fields
        """What `chat_response` calls with the chat view it built."""
        return lambda inner: cls(inner.state, inner.body, inner.job, inner=inner, **fields)

    # ---- what a protocol defines --------------------------------------------------------------------
    def whole_body(self, blocks: list[Block], ending: Ending) -> dict[str, Any]:
        raise NotImplementedError

    def opening(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def on_block(self, event: BlockEvent) -> list[dict[str, Any]]:
        raise NotImplementedError

    def closing(self, ending: Ending) -> list[dict[str, Any]]:
        raise NotImplementedError

    # ---- the chat view's interface, translated ------------------------------------------------------
    def whole(self, results: list[Completion]) -> dict[str, Any]:
        chat = self.inner.whole(results)
        choice = chat["choices"][0]
        ending = usage_ending(Ending(choice["finish_reason"], choice.get("matched_stop")), chat["usage"])
        return self.whole_body(blocks_of(choice["message"]), ending)

    def start(self) -> list[dict]:
        return self.opening()

    def render(self, k: int, chunk: StreamChunk) -> list[dict]:
        return [out for event in self.inner.render(k, chunk) for block in self.blocks.feed(event)
                for out in self.on_block(block)]

    def finish(self) -> list[dict]:
        for event in self.inner.finish():  # the usage (the chat body asks for it)
            self.blocks.feed(event)
        return [*(out for block in self.blocks.end() for out in self.on_block(block)),
                *self.closing(self.blocks.ending)]


# ---- the chat request -----------------------------------------------------------------------------
def chat_request(fields: dict[str, Any], param_names: dict[str, str]) -> ChatCompletionRequest:
    """The chat request a protocol's request became; a field it cannot hold is a 400 named as the
    client spelled it (`param_names`: chat field -> the protocol's)."""
    if fields.get("stream"):
        fields["stream_options"] = {"include_usage": True}  # the closing events carry the usage
    try:
        body = ChatCompletionRequest.model_validate(fields)
    except ValidationError as e:
        err = e.errors()[0]
        loc = [str(p) for p in err.get("loc", ())]
        param = param_names.get(loc[0], loc[0]) if loc else None
        raise APIError(400, f"{param}: {err.get('msg', 'invalid value')}", param) from None
    return body


def supports_thinking_budget() -> bool:
    """Whether the chat route takes vLLM's `thinking_token_budget` (the reasoning work adds it)."""
    return "thinking_token_budget" in ChatCompletionRequest.model_fields


def thinking_switch(chat_template: str | None, enabled: bool | None) -> dict[str, Any]:
    """chat_template_kwargs turning a template's thinking on or off, where the template has that switch
    (Qwen3's `enable_thinking`); else nothing: the template decides."""
    if enabled is None or not chat_template or "enable_thinking" not in chat_template:
        return {}
    return {"chat_template_kwargs": {"enable_thinking": enabled}}


# ---- server-sent events with event names ----------------------------------------------------------
def named_events(response: Response, error_event: Callable[[dict[str, Any]], dict[str, Any]]) -> Response:
    """A stream's `data: {json}` frames (server/serving.py's) as `event: {type}` + `data:` frames, as both
    protocols send them (the anthropic SDK reads the event name); an error frame becomes the protocol's
    error event, and the chat stream's closing `[DONE]` is dropped (neither protocol sends it)."""
    if not isinstance(response, StreamingResponse):
        return response
    frames = response.body_iterator

    async def renamed() -> AsyncIterator[str]:
        try:
            async for frame in frames:
                text = frame if isinstance(frame, str) else bytes(frame).decode()
                data = text.removeprefix("data: ").strip()
                if data == "[DONE]":
                    continue
                obj = json.loads(data)
                if "error" in obj and "type" not in obj:
                    obj = error_event(obj["error"])
                yield f"event: {obj['type']}\ndata: {json.dumps(obj, ensure_ascii=False)}\n\n"
        finally:  # closed early (the client left): the chat stream closes now and aborts its requests
            close = getattr(frames, "aclose", None)
            if close is not None:
                await close()

    response.body_iterator = renamed()
    return response
