"""The request schema: per-request sampling fields (SGLang's names), their defaults, types and ranges.

Declared once, here. lang/ (gen, run defaults) and server/ (native and OpenAI bodies) derive their
fields from `SamplingParams`; validation.py checks values against these rules (`check_fields`), each
caller passing its own spelling of each field so that an error names the field as the caller wrote it.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from .config import DEFAULT_MAX_NEW_TOKENS, MAX_LOGIT_BIAS, MAX_N, MAX_PENALTY, MAX_TEMPERATURE

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


def _field(default: object, rule: Rule) -> Any:  # noqa: ANN401 - a Field posing as the default, as field()'s
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
    # reasoning models (issue 44): the thinking block comes first, then the constraint applies to the answer
    reasoning_parser: str | None = _field(None, Rule("text"))  # SGLang's parser name: the block's markers
    thinking_token_budget: int | None = _field(None, Rule("optional_int", 0))  # vLLM's: then the block is closed

    @property
    def constraint(self) -> tuple[str, Any] | None:
        """('regex' | 'json_schema' | 'grammar' | 'ebnf' | 'structural_tag', spec), or None when unconstrained."""
        for name in CONSTRAINT_FIELDS:
            if getattr(self, name) is not None:
                return name, getattr(self, name)
        return None


RULES: dict[str, Rule] = {f.name: f.metadata["rule"] for f in dataclasses.fields(SamplingParams)}
