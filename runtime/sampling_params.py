"""The request schema: per-request sampling fields (SGLang's names), their defaults, types and ranges.

Declared once, here. lang/ (gen, run defaults) and server/ (native and OpenAI bodies) derive their
fields from `SamplingParams` and check values with `check_fields`, passing their own spelling of each
field so that an error names the field as the caller wrote it.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from .config import (DEFAULT_MAX_NEW_TOKENS, GREEDY_TEMPERATURE, MAX_LOGIT_BIAS, MAX_N, MAX_PENALTY, MAX_STOP_REGEX_LEN,
                     MAX_TEMPERATURE)

CONSTRAINT_FIELDS = ("regex", "json_schema", "grammar", "ebnf", "structural_tag")  # at most one per request
# SGLang's names for fields kept here under another name
ALIASES = {"sampling_seed": "seed"}
# SGLang's fields radixlang does not implement: accepted only at their "off" value, as named here
UNSUPPORTED = {"beam_width": ((None, 1), "beam search is not supported; use n for several samples"),
               "watermark": ((None,), "watermarking is not supported")}


@dataclass(frozen=True, slots=True)
class Rule:
    """The values a field accepts. A bound is a number or the name of a limit only known later: a
    model's (context_length, vocab_size) or another field's value (min_new_tokens <= max_new_tokens)."""

    # int | optional_int | float | bool | seed | strings | regexes | token_ids | text | json_object | bias |
    # unsupported (only SGLang's "off" value, see UNSUPPORTED) | any
    kind: str
    lo: float | str = -math.inf
    hi: float | str = math.inf
    lo_open: bool = False  # (lo, hi] instead of [lo, hi]
    accepts: Any = None  # the type a caller may send, when wider than the field's (stop: one string)
    hi_ids: str | None = None  # bias: the keys are token ids below this limit


def _field(default: Any, rule: Rule) -> Any:
    """A field with its rule; a list default is a fresh list per instance."""
    if isinstance(default, list):
        return field(default_factory=list, metadata={"rule": rule})
    return field(default=default, metadata={"rule": rule})


@dataclass(slots=True)
class SamplingParams:
    max_new_tokens: int = _field(DEFAULT_MAX_NEW_TOKENS, Rule("int", 0, "context_length"))
    min_new_tokens: int = _field(0, Rule("int", 0, "max_new_tokens"))
    temperature: float = _field(1.0, Rule("float", 0.0, MAX_TEMPERATURE))
    top_p: float = _field(1.0, Rule("float", 0, 1, lo_open=True))
    top_k: int = _field(-1, Rule("int", -1, "vocab_size"))  # -1 or 0: no top-k
    min_p: float = _field(0.0, Rule("float", 0.0, 1.0))
    frequency_penalty: float = _field(0.0, Rule("float", -MAX_PENALTY, MAX_PENALTY))
    presence_penalty: float = _field(0.0, Rule("float", -MAX_PENALTY, MAX_PENALTY))
    repetition_penalty: float = _field(1.0, Rule("float", 0, MAX_PENALTY, lo_open=True))
    stop: list[str] = _field([], Rule("strings", accepts=str | list[str]))
    stop_token_ids: list[int] = _field([], Rule("token_ids", hi="vocab_size"))
    ignore_eos: bool = _field(False, Rule("bool"))
    skip_special_tokens: bool = _field(True, Rule("bool"))
    no_stop_trim: bool = _field(False, Rule("bool"))
    n: int = _field(1, Rule("int", 1, MAX_N))
    seed: int | None = _field(None, Rule("seed", -(2**63), 2**64 - 1))  # a signed or unsigned 64-bit integer
    # constrained decoding: at most one of these
    regex: str | None = _field(None, Rule("text"))
    json_schema: Any = _field(None, Rule("any"))  # dict, JSON string, or pydantic model class
    grammar: str | None = _field(None, Rule("text"))  # Lark grammar (LALR), start rule `start`
    # SGLang's fields added for its clients (issue 25): each is checked, used, or documented as a no-op
    stop_regex: list[str] = _field([], Rule("regexes", accepts=str | list[str]))  # output ends at a match
    logit_bias: dict[str, float] | None = _field(None, Rule("bias", -MAX_LOGIT_BIAS, MAX_LOGIT_BIAS,
                                                            hi_ids="vocab_size"))
    spaces_between_special_tokens: bool = _field(True, Rule("bool"))  # no-op: fast tokenizers never add them
    stream_interval: int | None = _field(None, Rule("optional_int", 1))  # /generate streams every k tokens
    custom_params: dict[str, Any] | None = _field(None, Rule("json_object"))  # no-op: no custom logit processors
    beam_width: int | None = _field(None, Rule("unsupported"))
    ebnf: str | None = _field(None, Rule("text"))  # XGrammar's EBNF (GBNF-like), start rule `root`
    structural_tag: Any = _field(None, Rule("any"))  # dict or JSON string: free text + triggered schemas
    watermark: Any = _field(None, Rule("unsupported"))

    @classmethod
    def from_any(cls, params: "SamplingParams | Mapping[str, Any] | None") -> "SamplingParams":
        if params is None:
            return cls()
        if isinstance(params, SamplingParams):
            return dataclasses.replace(params, stop=list(params.stop), stop_token_ids=list(params.stop_token_ids),
                                       stop_regex=list(params.stop_regex))
        if not isinstance(params, Mapping):
            raise TypeError(f"sampling_params must be a dict or SamplingParams, got {type(params).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(params) - known - set(ALIASES))
        if unknown:
            raise ValueError(f"unknown sampling field(s) {unknown}; known fields are {sorted(known | set(ALIASES))}")
        values = {k: v for k, v in params.items() if v is not None or k == "seed"}
        for alias, name in ALIASES.items():
            if alias in values:
                _merge_alias(values, alias, name)
        for name in ("stop", "stop_regex"):
            if isinstance(values.get(name), str):
                values[name] = [values[name]]
        return cls(**values)

    @property
    def constraint(self) -> tuple[str, Any] | None:
        """('regex' | 'json_schema' | 'grammar' | 'ebnf' | 'structural_tag', spec), or None when unconstrained."""
        for name in CONSTRAINT_FIELDS:
            if getattr(self, name) is not None:
                return name, getattr(self, name)
        return None

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1

    def validate(self, vocab_size: int | None, context_length: int | None,
                 names: Mapping[str, str] | None = None) -> None:
        """Checks every field; an error names a field as `names` spells it (default: as here)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        check_fields(values, vocab_size=vocab_size, context_length=context_length, names=names)


def _merge_alias(values: dict[str, Any], alias: str, name: str) -> None:
    value = values.pop(alias)
    if values.get(name) is not None and values[name] != value:
        raise ValueError(f"{alias} and {name} name the same field; they differ ({value} vs {values[name]})")
    values[name] = value


class FieldError(ValueError):
    """A bad value in a request; `field` is the field's name as the caller spelled it."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


RULES: dict[str, Rule] = {f.name: f.metadata["rule"] for f in dataclasses.fields(SamplingParams)}


def check_fields(values: Mapping[str, Any], *, vocab_size: int | None = None, context_length: int | None = None,
                 names: Mapping[str, str] | None = None) -> None:
    """Checks the given fields (a subset is fine; the engine's names); a limit that is None is not
    known yet and not checked. Raises FieldError naming the field as `names` spells it."""
    names = names or {}
    limits = {"vocab_size": vocab_size, "context_length": context_length,
              "max_new_tokens": values.get("max_new_tokens")}
    for name, value in values.items():
        rule = RULES[name]
        label = names.get(name, name)
        lo, hi = (_bound(b, limits, names) for b in (rule.lo, rule.hi))
        if rule.kind == "bias":
            _check_bias(label, value, lo, hi, _bound(rule.hi_ids, limits, names))
        elif rule.kind == "unsupported":
            _check_unsupported(name, label, value)
        else:
            _CHECKS[rule.kind](label, value, rule, lo, hi)
    given = [name for name in CONSTRAINT_FIELDS if values.get(name) is not None]
    if len(given) > 1:
        spelled = [names.get(n, n) for n in given]
        raise FieldError(spelled[1], f"{' and '.join(spelled)} are exclusive: use at most one")


def _bound(bound: float | str, limits: Mapping[str, Any], names: Mapping[str, str]) -> float | str:
    """A numeric bound, a known limit's value, or (unknown yet) the limit's name as the caller spells it."""
    if not isinstance(bound, str):
        return bound
    value = limits.get(bound)
    return names.get(bound, bound) if value is None else value


def _in_range(value: float, rule: Rule, lo: float | str, hi: float | str) -> bool:
    above = isinstance(lo, str) or (value > lo if rule.lo_open else value >= lo)
    return above and (isinstance(hi, str) or value <= hi)


def _range_error(label: str, value: Any, rule: Rule, lo: Any, hi: Any) -> FieldError:
    return FieldError(label, f"{label} must be in {'(' if rule.lo_open else '['}{lo}, {hi}], got {value}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(label: str, value: Any, rule: Rule, lo: Any, hi: Any) -> None:
    if not _is_int(value):
        raise FieldError(label, f"{label} must be an integer, got {value!r}")
    if not _in_range(value, rule, lo, hi):
        raise _range_error(label, value, rule, lo, hi)


def _check_float(label: str, value: Any, rule: Rule, lo: Any, hi: Any) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise FieldError(label, f"{label} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise FieldError(label, f"{label} must be a finite number, got {value!r}")
    if not _in_range(value, rule, lo, hi):
        raise _range_error(label, value, rule, lo, hi)


def _check_bool(label: str, value: Any, rule: Rule, lo: Any, hi: Any) -> None:
    if not isinstance(value, bool):
        raise FieldError(label, f"{label} must be a boolean, got {value!r}")


def _check_seed(label: str, value: Any, rule: Rule, lo: Any, hi: Any) -> None:
    if value is not None and not _is_int(value):
        raise FieldError(label, f"{label} must be an integer, got {value!r}")
    if value is not None and not _in_range(value, rule, lo, hi):
        raise _range_error(label, value, rule, lo, hi)


def _check_strings(label: str, value: Any, rule: Rule, lo: Any, hi: Any) -> None:
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
        raise FieldError(label, f"{label} must be a non-empty string or a list of them, got {value!r}")


def _check_token_ids(label: str, value: Any, rule: Rule, lo: Any, hi: Any) -> None:
    known = not isinstance(hi, str)
    if not isinstance(value, list) or not all(_is_int(t) and 0 <= t and (not known or t < hi) for t in value):
        raise FieldError(label, f"{label} must be token ids in [0, {hi}), got {value!r}")


def _check_text(label: str, value: Any, rule: Rule, lo: Any, hi: Any) -> None:
    if value is not None and not isinstance(value, str):
        raise FieldError(label, f"{label} must be a string, got {type(value).__name__}")


def _check_optional_int(label: str, value: Any, rule: Rule, lo: Any, hi: Any) -> None:
    if value is not None:
        _check_int(label, value, rule, lo, hi)


def _check_regexes(label: str, value: Any, rule: Rule, lo: Any, hi: Any) -> None:
    _check_strings(label, value, rule, lo, hi)
    for pattern in value:
        if len(pattern.encode()) > MAX_STOP_REGEX_LEN:
            raise FieldError(label, f"{label}: a pattern may be at most {MAX_STOP_REGEX_LEN} bytes, got "
                                    f"{len(pattern.encode())}")
        try:
            compiled = re.compile(pattern)
        except re.error as e:
            raise FieldError(label, f"{label}: {pattern!r} is not a valid regular expression: {e}") from None
        if compiled.match("") is not None:
            raise FieldError(label, f"{label}: {pattern!r} matches the empty string, so it would stop at once")


def _check_bias(label: str, value: Any, lo: float, hi: float, vocab: Any) -> None:
    """OpenAI's and SGLang's logit_bias: {"token id": bias}, each bias in [lo, hi]."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise FieldError(label, f"{label} must be an object of token id -> bias, got {type(value).__name__}")
    for key, bias in value.items():
        token = int(key) if isinstance(key, str) and key.isdigit() else key if _is_int(key) else None
        if token is None or (not isinstance(vocab, str) and not 0 <= token < vocab):
            raise FieldError(label, f"{label} keys must be token ids in [0, {vocab}), got {key!r}")
        if not isinstance(bias, (int, float)) or isinstance(bias, bool) or not lo <= bias <= hi:
            raise FieldError(label, f"{label}[{key!r}] must be a number in [{lo}, {hi}], got {bias!r}")


def _check_json_object(label: str, value: Any, rule: Rule, lo: Any, hi: Any) -> None:
    if value is not None and not (isinstance(value, dict) and all(isinstance(k, str) for k in value)):
        raise FieldError(label, f"{label} must be a JSON object, got {type(value).__name__}")


def _check_unsupported(name: str, label: str, value: Any) -> None:
    allowed, reason = UNSUPPORTED[name]
    if not any(value is a or (a is not None and value == a and _is_int(value)) for a in allowed):
        raise FieldError(label, f"{label}={value!r}: {reason}")


_CHECKS = {"int": _check_int, "optional_int": _check_optional_int, "regexes": _check_regexes,
           "json_object": _check_json_object, "float": _check_float, "bool": _check_bool, "seed": _check_seed,
           "strings": _check_strings, "token_ids": _check_token_ids, "text": _check_text,
           "any": lambda *_: None}
