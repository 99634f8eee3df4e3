"""Reasoning formats for separate_reasoning: the table lives in runtime/reasoning_formats.py (one source of
truth for the language, the server's reasoning parsers and the think-then-constrain constraint)."""
from __future__ import annotations

from ..runtime.reasoning_formats import REASONING_FORMATS, ReasoningFormat, reasoning_format

__all__ = ["REASONING_FORMATS", "ReasoningFormat", "reasoning_format", "reasoning_variable"]


def reasoning_variable(name: str) -> str:
    """Where separate_reasoning puts variable `name`'s reasoning (SGLang's name)."""
    return f"{name}_reasoning_content"
