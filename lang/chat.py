"""Role rendering: the text a model's chat template puts before and after one message's content."""
from __future__ import annotations

from typing import Any, Callable, Sequence

Renderer = Callable[[Sequence[dict[str, Any]], bool], str]  # (messages, add_generation_prompt) -> text
_CONTENT = "\ue000radixlang-content\ue001"  # stands for the content while a template renders


class ChatTemplate:
    """Splits a rendered conversation into per-role prefixes and suffixes.

    The prefix of a new message is what the template adds to the conversation so far before the
    message's content (a default system prompt included); the suffix is what it adds after. So the
    text of a program that uses roles equals the template applied to `state.messages()`.
    """

    def __init__(self, render: Renderer):
        self._render = render

    def affixes(self, role: str, history: Sequence[dict[str, Any]]) -> tuple[str, str]:
        before = self._render(list(history), False)
        after = self._render([*history, {"role": role, "content": _CONTENT}], False)
        if not after.startswith(before):
            raise ValueError("this chat template re-renders earlier messages when one is added, "
                             "so roles cannot be appended incrementally")
        added = after[len(before):]
        if added.count(_CONTENT) != 1:
            raise ValueError(f"the chat template does not render a {role!r} message's content verbatim")
        prefix, suffix = added.split(_CONTENT)
        return prefix, suffix
