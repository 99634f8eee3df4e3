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


def _field(default: object, rule: Rule, help: str) -> Any:  # noqa: ANN401 - a Field posing as the default
    """A field with its rule and its description (docs/reference/sampling.md is generated from them); a list
    default is a fresh list per instance."""
    if isinstance(default, list):
        return field(default_factory=list, metadata={"rule": rule, "help": help})
    return field(default=default, metadata={"rule": rule, "help": help})


@dataclass(slots=True)
class SamplingParams:
    max_new_tokens: int = _field(DEFAULT_MAX_NEW_TOKENS, Rule("int", 0, "context_length"),
                                 "tokens to generate at most")
    min_new_tokens: int = _field(0, Rule("int", 0, "max_new_tokens"),
                                 "tokens generated before a stop string or EOS may end the output")
    temperature: float = _field(1.0, Rule("float", 0.0, MAX_TEMPERATURE), "sampling temperature; 0 is greedy")
    top_p: float = _field(1.0, Rule("float", 0, 1, lo_open=True),
                          "nucleus sampling: the smallest set of tokens whose probabilities reach this sum")
    top_k: int = _field(-1, Rule("int", -1, "vocab_size"), "sample among the k likeliest tokens; -1 or 0: all")
    min_p: float = _field(0.0, Rule("float", 0.0, 1.0), "drop tokens less likely than this times the likeliest")
    frequency_penalty: float = _field(0.0, Rule("float", -MAX_PENALTY, MAX_PENALTY),
                                      "subtracted from a token's logit for each time it occurred in the output")
    presence_penalty: float = _field(0.0, Rule("float", -MAX_PENALTY, MAX_PENALTY),
                                     "subtracted from a token's logit once it occurred in the output")
    repetition_penalty: float = _field(1.0, Rule("float", 0, MAX_PENALTY, lo_open=True),
                                       "scales down the logits of tokens seen in the prompt or output (> 1: fewer "
                                       "repeats)")
    stop: list[str] = _field([], Rule("strings", accepts=str | list[str]),
                             "strings that end the output (left out of the text unless no_stop_trim)")
    stop_token_ids: list[int] = _field([], Rule("token_ids", hi="vocab_size"), "token ids that end the output")
    ignore_eos: bool = _field(False, Rule("bool"), "keep generating past the end-of-sequence token")
    skip_special_tokens: bool = _field(True, Rule("bool"), "leave special tokens out of the text")
    no_stop_trim: bool = _field(False, Rule("bool"), "keep the matched stop string at the end of the text")
    n: int = _field(1, Rule("int", 1, MAX_N), "samples per prompt")
    seed: int | None = _field(None, Rule("seed", -(2**63), 2**64 - 1),  # a signed or unsigned 64-bit integer
                              "this request's sampling seed; default: one drawn from the engine's seed")
    # constrained decoding: at most one of these
    regex: str | None = _field(None, Rule("text"), "constrain the output to this regular expression")
    json_schema: Any = _field(None, Rule("any"),  # dict, JSON string, or pydantic model class
                              "constrain the output to JSON matching this schema (a dict, JSON text or pydantic model)")
    grammar: str | None = _field(None, Rule("text"), "constrain the output to this Lark grammar (LALR, start rule "
                                 "`start`)")
    # SGLang's fields added for its clients (issue 25): each is checked, used, or documented as a no-op
    stop_regex: list[str] = _field([], Rule("regexes", accepts=str | list[str]),
                                   "regular expressions whose match ends the output")
    logit_bias: dict[str, float] | None = _field(None, Rule("bias", -MAX_LOGIT_BIAS, MAX_LOGIT_BIAS,
                                                            hi_ids="vocab_size"),
                                                 "token id -> value added to its logit (-100 bans it, 100 forces it)")
    spaces_between_special_tokens: bool = _field(True, Rule("bool"), "accepted for SGLang's clients; no effect "
                                                 "(fast tokenizers never add those spaces)")
    stream_interval: int | None = _field(None, Rule("optional_int", 1),
                                         "/generate streams an event every this many tokens")
    custom_params: dict[str, Any] | None = _field(None, Rule("json_object"), "accepted for SGLang's clients; no "
                                                  "effect (no custom logit processors)")
    beam_width: int | None = _field(None, Rule("unsupported"), "SGLang's field; only 1 or unset (beam search is "
                                    "not supported; use n)")
    ebnf: str | None = _field(None, Rule("text"), "constrain the output to this EBNF grammar (XGrammar's, GBNF-like; "
                              "start rule `root`)")
    structural_tag: Any = _field(None, Rule("any"), "free text in which trigger strings start JSON constrained to "
                                 "their schemas (a dict or JSON text)")
    watermark: Any = _field(None, Rule("unsupported"), "SGLang's field; only unset (watermarking is not supported)")
    # reasoning models: the thinking block comes first, then the constraint applies to the answer
    reasoning_parser: str | None = _field(None, Rule("text"), "reasoning format by SGLang's parser name (qwen3, "
                                          "deepseek-r1, ...); default: the server's --reasoning-parser")
    thinking_token_budget: int | None = _field(None, Rule("optional_int", 0), "thinking tokens at most (vLLM's "
                                               "name): the engine then closes the block and the answer follows")
    json_schema_strict: bool = _field(False, Rule("bool"), "json_schema in OpenAI's strict form: properties in "
                                      "declared order, undeclared ones only where the schema allows them "
                                      "explicitly (default: the schema's own semantics, any order)")

    @property
    def constraint(self) -> tuple[str, Any] | None:
        """('regex' | 'json_schema' | 'json_schema_strict' | 'grammar' | 'ebnf' | 'structural_tag', spec), or None
        when unconstrained."""
        for name in CONSTRAINT_FIELDS:
            if getattr(self, name) is not None:
                strict = name == "json_schema" and self.json_schema_strict
                return ("json_schema_strict" if strict else name), getattr(self, name)
        return None


RULES: dict[str, Rule] = {f.name: f.metadata["rule"] for f in dataclasses.fields(SamplingParams)}
