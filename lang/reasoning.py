"""Reasoning formats: how a model family marks the thinking it writes before its answer (`<think>…</think>`),
keyed by SGLang's reasoning-parser model types, and the split of a finished text into (reasoning, answer)
as SGLang's ReasoningParser.parse_non_stream makes it."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ReasoningFormat:
    start: str
    end: str
    forced: bool = False  # the model starts inside the reasoning: its output may omit `start`
    tool_start: str | None = None  # a tool call that begins before `end` closes the reasoning

    def split(self, text: str) -> tuple[str, str]:
        """(reasoning, answer). Leading `start` tags are dropped; without `end`, the text is reasoning cut
        short (unless a tool call begins in it); text that never entered reasoning is all answer."""
        if not (self.forced or self.start in text):
            return "", text
        while text.startswith(self.start):
            text = text[len(self.start):]
        if self.end in text:
            reasoning, answer = text.split(self.end, 1)
            return reasoning, answer
        tool = text.find(self.tool_start) if self.tool_start else -1
        if tool != -1:
            return text[:tool], text[tool:]
        return text, ""


_R1 = ReasoningFormat("<think>", "</think>", forced=True)
_QWEN3 = ReasoningFormat("<think>", "</think>", tool_start="<tool_call>")
_QWEN3_FORCED = ReasoningFormat("<think>", "</think>", forced=True, tool_start="<tool_call>")

# SGLang's names (srt/parser/reasoning_parser.py's DetectorMap) for the formats that differ only in tags
REASONING_FORMATS: dict[str, ReasoningFormat] = {
    "deepseek-r1": _R1, "step3": _R1, "step3p5": _R1, "gigachat35": _R1,
    "qwen3": _QWEN3, "deepseek-v3": _QWEN3, "dots": _QWEN3, "nanbeige": _QWEN3, "interns1": _QWEN3,
    "glm45": _QWEN3,
    "qwen3-thinking": _QWEN3_FORCED, "minimax": _QWEN3_FORCED,
    "kimi": ReasoningFormat("◁think▷", "◁/think▷"),
    "kimi_k2": ReasoningFormat("<think>", "</think>", tool_start="<|tool_calls_section_begin|>"),
    "mistral": ReasoningFormat("[THINK]", "[/THINK]"),
}


def reasoning_format(model_type: object) -> ReasoningFormat:
    """The format SGLang's reasoning parser `model_type` (case-insensitive) reads; ValueError if unknown."""
    if not isinstance(model_type, str) or not model_type:
        raise ValueError(f"separate_reasoning needs a model_type, one of {sorted(REASONING_FORMATS)}; "
                         f"got {model_type!r}")
    found = REASONING_FORMATS.get(model_type.lower())
    if found is None:
        raise ValueError(f"unsupported reasoning model_type {model_type!r}; one of {sorted(REASONING_FORMATS)}")
    return found


def reasoning_variable(name: str) -> str:
    """Where separate_reasoning puts variable `name`'s reasoning (SGLang's name)."""
    return f"{name}_reasoning_content"
