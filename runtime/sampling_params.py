"""Per-request sampling parameters (SGLang's field names), validated on the caller's thread."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from .config import DEFAULT_MAX_NEW_TOKENS, GREEDY_TEMPERATURE, MAX_N, MAX_PENALTY, MAX_TEMPERATURE


@dataclass(slots=True)
class SamplingParams:
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: no top-k
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    seed: int | None = None
    # constrained decoding: at most one of these
    regex: str | None = None
    json_schema: Any = None  # dict, JSON string, or pydantic model class
    grammar: str | None = None  # Lark grammar (LALR), start rule `start`

    @classmethod
    def from_any(cls, params: "SamplingParams | Mapping[str, Any] | None") -> "SamplingParams":
        if params is None:
            return cls()
        if isinstance(params, SamplingParams):
            return dataclasses.replace(params, stop=list(params.stop),
                                       stop_token_ids=list(params.stop_token_ids))
        if not isinstance(params, Mapping):
            raise TypeError(f"sampling_params must be a dict or SamplingParams, got {type(params).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ValueError(f"unknown sampling field(s) {unknown}; known fields are {sorted(known)}")
        values = {k: v for k, v in params.items() if v is not None or k == "seed"}
        if isinstance(values.get("stop"), str):
            values["stop"] = [values["stop"]]
        return cls(**values)

    @property
    def constraint(self) -> tuple[str, Any] | None:
        """('regex' | 'json_schema' | 'grammar', spec), or None when unconstrained."""
        for name in ("regex", "json_schema", "grammar"):
            if getattr(self, name) is not None:
                return name, getattr(self, name)
        return None

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1

    def validate(self, vocab_size: int, context_length: int) -> None:
        _check_int("max_new_tokens", self.max_new_tokens, 0, context_length)
        _check_int("min_new_tokens", self.min_new_tokens, 0, self.max_new_tokens)
        _check_float("temperature", self.temperature, 0.0, MAX_TEMPERATURE)
        _check_float("top_p", self.top_p, 0.0, 1.0)
        if self.top_p == 0.0:
            raise ValueError("top_p must be in (0, 1], got 0")
        _check_int("top_k", self.top_k, -1, vocab_size)
        _check_float("min_p", self.min_p, 0.0, 1.0)
        _check_float("frequency_penalty", self.frequency_penalty, -MAX_PENALTY, MAX_PENALTY)
        _check_float("presence_penalty", self.presence_penalty, -MAX_PENALTY, MAX_PENALTY)
        _check_float("repetition_penalty", self.repetition_penalty, 0.0, MAX_PENALTY)
        if self.repetition_penalty == 0.0:
            raise ValueError("repetition_penalty must be > 0, got 0")
        _check_int("n", self.n, 1, MAX_N)
        if self.seed is not None:  # sample j of n seeds torch with seed + j, a signed or unsigned 64-bit integer
            _check_int("seed", self.seed, -(2**63), 2**64 - self.n)
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be a non-empty string or a list of them, got {self.stop!r}")
        if not isinstance(self.stop_token_ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size for t in self.stop_token_ids
        ):
            raise ValueError(f"stop_token_ids must be token ids in [0, {vocab_size}), got {self.stop_token_ids!r}")
        for name in ("ignore_eos", "skip_special_tokens", "no_stop_trim"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a boolean, got {getattr(self, name)!r}")
        given = [name for name in ("regex", "json_schema", "grammar") if getattr(self, name) is not None]
        if len(given) > 1:
            raise ValueError(f"regex, json_schema and grammar are exclusive; got {given}")
        for name in ("regex", "grammar"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a string, got {type(getattr(self, name)).__name__}")


def _check_int(name: str, value: Any, lo: int, hi: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value}")


def _check_float(name: str, value: Any, lo: float, hi: float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or (
        isinstance(value, float) and not math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value}")
