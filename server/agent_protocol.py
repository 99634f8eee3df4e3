"""Request bodies of the agent protocols: OpenAI's Responses API (/v1/responses) and Anthropic's Messages
API (/v1/messages). Strict like the other routes' (server/protocol.py): an unknown field is a 400. Items and
content blocks stay dicts here: server/responses_api.py and server/messages_api.py check them one by one,
so an error names the item (`input[2].call_id`, `messages[1].content[0].source`)."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from .protocol import StrictModel


# ---- OpenAI Responses -----------------------------------------------------------------------------
class ResponsesText(StrictModel):
    # {"type": "text"} | {"type": "json_object"} | {"type": "json_schema", "name", "schema", "strict", ...}
    format: dict[str, Any] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # accepted; the model's length is its own


class ResponsesReasoning(StrictModel):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None  # accepted; reasoning comes whole, not summed up
    generate_summary: Literal["auto", "concise", "detailed"] | None = None  # summary's older name


class ResponsesRequest(StrictModel):
    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: ResponsesText | None = None
    reasoning: ResponsesReasoning | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None  # OpenAI's include_obfuscation: nothing to obfuscate here
    previous_response_id: str | None = None
    store: bool = True  # OpenAI's default: kept, so a later request can continue it
    metadata: dict[str, str] | None = None  # kept with the response
    prompt_cache_key: str | None = Field(None, min_length=1, max_length=256)
    # vLLM's extension, as on the chat route: thinking tokens at most, then the engine closes the block
    thinking_token_budget: int | None = Field(None, ge=0)
    # accepted and ignored: routing and bookkeeping that one local server has no use for
    user: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    prompt_cache_retention: str | None = None  # the server's --prompt-cache-retention decides
    max_tool_calls: int | None = None  # a cap on built-in (hosted) tool calls, which are not supported
    background: Literal[False] = False  # background runs are not supported


# ---- Anthropic Messages ---------------------------------------------------------------------------
class Thinking(StrictModel):
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: int | None = Field(None, ge=1)
    display: Literal["summarized", "omitted"] | None = None  # accepted; thinking comes back whole


class OutputConfig(StrictModel):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None  # accepted and ignored
    format: dict[str, Any] | None = None  # {"type": "json_schema", "schema": {...}}: the reply is that JSON


class CountTokensRequest(StrictModel):
    """POST /v1/messages/count_tokens: the prompt part of a Messages request."""

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    # automatic prompt caching: a breakpoint that moves with the conversation (see server/messages_api.py)
    cache_control: dict[str, Any] | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)  # required, as Anthropic's API has it
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    # accepted and ignored: bookkeeping that one local server has no use for
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
