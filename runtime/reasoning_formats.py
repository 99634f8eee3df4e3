"""Reasoning formats: how a model family marks the thinking it writes before its answer (`<think>…</think>`),
keyed by SGLang's reasoning-parser names. One table for every layer: the runtime's think-then-constrain
constraint reads the markers, the server splits replies with it, lang's separate_reasoning re-exports it.

Three reusable pieces besides the table:
- `ReasoningFormat.split`: a finished text as (reasoning, answer), as SGLang's parse_non_stream makes it;
- `prompt_phase`: where a rendered prompt leaves the model (the template opened the block, closed it, or
  neither), so that a reply whose prompt opened the block splits although its text has no start marker;
- `ReasoningStream`: the same split made incrementally, for streamed deltas (partial markers held back).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

PROMPT_TAIL_TOKENS = 16  # a generation prompt's last tokens hold its opened (or closed) thinking block
Phase = Literal["open", "think", "answer"]  # the model must open the block / is inside it / is past it


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

    def after_prompt(self, phase: Phase) -> "ReasoningFormat":
        """The format that splits a reply generated after a prompt in `phase`: inside an opened block the
        reply starts in reasoning (forced); after a closed one it is all answer."""
        if phase == "think":
            return dataclasses.replace(self, forced=True)
        if phase == "answer":
            return dataclasses.replace(self, start="\0no-reasoning\0", forced=False)
        return self


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


def detect_reasoning_parser(chat_template: str | None) -> str | None:
    """The reasoning parser a chat template implies, where unambiguous: a template that writes `<think>`
    and reads `enable_thinking` is Qwen3's family (the model may skip the block); one that opens the block
    in its generation prompt without that switch forces thinking (DeepSeek-R1's); else none."""
    template = chat_template or ""
    if "<think>" not in template:
        return "mistral" if "[THINK]" in template and "[/THINK]" in template else None
    if "enable_thinking" in template:
        return "qwen3"
    return "deepseek-r1"


def resolve_reasoning_parser(setting: str, chat_template: str | None) -> str | None:
    """The engine's parser: a name as given, 'auto' detected from the template, 'none' off (None)."""
    if setting == "none":
        return None
    if setting == "auto":
        return detect_reasoning_parser(chat_template)
    reasoning_format(setting)  # a ValueError lists the names
    return setting.lower()


def prompt_phase(fmt: ReasoningFormat, prompt_tail: str) -> Phase:
    """Where a prompt ending in `prompt_tail` leaves the model: its generation prompt opened the block
    (`<think>\\n`: the count of thinking tokens starts at the first generated one), closed it (Qwen3's
    enable_thinking=false writes an empty block: no thinking), or neither (the model opens it)."""
    tail = prompt_tail.rstrip()
    if tail.endswith(fmt.start):
        return "think"
    if tail.endswith(fmt.end):
        return "answer"
    return "open"


@dataclass
class ReasoningStream:
    """`split` made incrementally: `feed` each piece of a reply (`finished` with the last) and get the
    (reasoning, content) text to send now. A partial marker at the end is held back until it resolves,
    so the joined deltas equal `split` of the whole text. `hold_reasoning` (SGLang's stream_reasoning=false)
    sends the reasoning in one piece once its block ends (or the reply does), not as it is decided."""

    fmt: ReasoningFormat
    hold_reasoning: bool = False
    text: str = ""
    sent_reasoning: int = 0  # characters of the split's reasoning sent so far
    sent_content: int = 0

    def feed(self, piece: str, finished: bool) -> tuple[str, str]:
        self.text += piece
        text = self.text
        if not finished and self._undecided(text):
            return "", ""
        reasoning, content = self.fmt.split(text)
        if not finished:
            reasoning, content = self._holding_back(text, reasoning, content)
            if self.hold_reasoning and not content and not self._block_ended(text):
                return "", ""
        out = reasoning[self.sent_reasoning:], content[self.sent_content:]
        self.sent_reasoning = max(self.sent_reasoning, len(reasoning))
        self.sent_content = max(self.sent_content, len(content))
        return out

    def _undecided(self, text: str) -> bool:
        """The reply so far is start markers and maybe the beginning of another: whether it reasons (and
        what the split drops) is not known yet."""
        start = self.fmt.start
        while text.startswith(start):
            text = text[len(start):]
        return start.startswith(text)

    @property
    def _end_markers(self) -> list[str]:
        """What ends the reasoning: the end marker, or a tool call."""
        return [self.fmt.end] + ([self.fmt.tool_start] if self.fmt.tool_start else [])

    def _block_ended(self, text: str) -> bool:
        return any(m in text for m in self._end_markers)

    def _holding_back(self, text: str, reasoning: str, content: str) -> tuple[str, str]:
        """Cuts a trailing partial marker (end, or a tool call that would end the reasoning)."""
        if content or not (self.fmt.forced or self.fmt.start in text):
            return reasoning, content
        keep = 0
        for m in self._end_markers:
            for n in range(min(len(m) - 1, len(reasoning)), 0, -1):
                if m.startswith(reasoning[-n:]):
                    keep = max(keep, n)
                    break
        return reasoning[:len(reasoning) - keep], content
