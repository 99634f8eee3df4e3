"""Reasoning models on the HTTP routes: the building blocks every route uses (chat completions here; the
Responses and Messages routes call the same functions).

- `template_kwargs`: the chat template's extra arguments (server defaults, then the request's);
- `reasoning_params`: the engine fields that make the thinking block come first (its constraint applies to
  the answer) and that bound it (`thinking_token_budget`);
- `reply_format`: how to split a reply generated after a given prompt (its template may open the block);
- `split_reply` / `ReasoningStream` (runtime/reasoning_formats.py): (reasoning, answer), whole or streamed;
- `default_max_tokens`: the output cap of a request that sets none.
"""
from __future__ import annotations

from typing import Any

from ..runtime.reasoning_formats import (
    PROMPT_TAIL_TOKENS,
    ReasoningFormat,
    ReasoningStream,
    prompt_phase,
    reasoning_format,
)
from ..runtime.tokenizer import Tokenizer
from .errors import APIError

__all__ = ["ReasoningStream", "default_max_tokens", "reasoning_params", "reply_format", "request_parser",
           "split_reply", "template_kwargs"]

# what chat_prompt passes itself: a request's chat_template_kwargs may not replace them
_RESERVED = {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "documents"}


def template_kwargs(defaults: dict[str, Any], requested: dict[str, Any] | None,
                    param: str = "chat_template_kwargs") -> dict[str, Any]:
    """The arguments a chat template render gets besides the messages: the server's
    --default-chat-template-kwargs, overridden key by key by the request's."""
    requested = requested or {}
    clash = sorted(set(requested) & _RESERVED)
    if clash:
        raise APIError(400, f"{param} may not set {clash}: the server passes them", param)
    return defaults | requested


def request_parser(requested: object, served: str | None, param: str) -> str | None:
    """A request's reasoning_parser (a radixlang extension) in lower case, else the server's; an unknown name is
    a 400 naming `param`."""
    if requested is None:
        return served
    try:
        reasoning_format(requested)
    except ValueError as e:
        raise APIError(400, str(e), param) from None
    return str(requested).lower()


def reasoning_params(parser: str | None, budget: int | None, param: str = "thinking_token_budget") -> dict[str, Any]:
    """Sampling params for a reasoning model: the parser's markers (the engine then applies any constraint
    after the thinking block) and the budget; a budget without a reasoning model is a 400."""
    if parser is None:
        if budget is not None:
            raise APIError(400, f"{param} needs a reasoning model: this server has no reasoning parser "
                                "(start it with --reasoning-parser)", param)
        return {}
    return {"reasoning_parser": parser} | ({} if budget is None else {"thinking_token_budget": budget})


def reply_format(parser: str | None, tokenizer: Tokenizer, prompt_ids: list[int]) -> ReasoningFormat | None:
    """The format that splits a reply to `prompt_ids` (None: no reasoning parser): a prompt whose template
    opened the block makes the reply start inside it; one that closed it (enable_thinking false) makes it
    all answer."""
    if parser is None:
        return None
    fmt = reasoning_format(parser)
    tail = tokenizer.decode(prompt_ids[-PROMPT_TAIL_TOKENS:], skip_special_tokens=False)
    return fmt.after_prompt(prompt_phase(fmt, tail))


def split_reply(fmt: ReasoningFormat | None, text: str) -> tuple[str | None, str]:
    """(reasoning_content or None when there is none, content)."""
    if fmt is None:
        return None, text
    reasoning, answer = fmt.split(text)
    return (reasoning or None), answer


def default_max_tokens(configured: int, context_length: int) -> int:
    """A chat request's output cap when it sets none: the server's default_max_tokens (0: the context); the
    engine stops at the context anyway, so the cap is min(default, context - prompt)."""
    return context_length if configured == 0 else min(configured, context_length)
