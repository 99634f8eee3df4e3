"""gen()'s fields, as the IR stores them, and their validation (checked on import against the runtime's schema)."""
from __future__ import annotations

import dataclasses
import json
import re
import typing
from typing import Any, Mapping

from ..runtime.constrained.structural_tag import parse_structural_tag
from ..runtime.sampling_params import CONSTRAINT_FIELDS, SamplingParams
from ..runtime.validation import check_fields
from .config import DTYPE_REGEXES, DTYPE_STOPS

# gen()'s spelling of the runtime's sampling fields where SGLang's gen() differs; run()'s defaults use
# the runtime's names
GEN_NAMES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}
# sampling fields SGLang's gen() does not take
NOT_IN_GEN = ("repetition_penalty", "skip_special_tokens", "no_stop_trim", "n", "seed", "logit_bias",
              "spaces_between_special_tokens", "stream_interval", "custom_params", "beam_width", "ebnf",
              "watermark", "json_schema_strict")  # json_schema_strict: OpenAI routes set it (response_format)
# gen()'s own fields: what to report (log-probabilities) and dtype, a constraint the language names
LANG_FIELDS: dict[str, Any] = {"return_logprob": bool, "logprob_start_len": int, "top_logprobs_num": int,
                               "return_text_in_logprobs": bool, "dtype": str,
                               "tool_calls": bool,  # tool_calls: the variable holds parsed calls
                               "lora": str}  # the LoRA adapter that generates (a name the backend serves)
IR_TYPES = {"json_schema": str}  # the IR keeps a schema as JSON text
GEN_CONSTRAINTS = ("dtype", *(name for name in CONSTRAINT_FIELDS if name not in NOT_IN_GEN))
_RUNTIME_NAMES = {lang: runtime for runtime, lang in GEN_NAMES.items()}


def _gen_fields() -> list[tuple[str, Any, Any]]:
    """(name, type | None, default None) per gen() field: each runtime sampling field gen takes, then gen()'s own."""
    hints = typing.get_type_hints(SamplingParams)
    fields = [(GEN_NAMES.get(f.name, f.name), IR_TYPES.get(f.name, hints[f.name]))
              for f in dataclasses.fields(SamplingParams) if f.name not in NOT_IN_GEN]
    return [(name, kind | None, dataclasses.field(default=None)) for name, kind in [*fields, *LANG_FIELDS.items()]]


@dataclasses.dataclass(slots=True)
class GenParams:
    """gen()'s fields (SGLang's names); None: inherit the run's default, then the backend's.

    Declared here so the type checker sees them; `_gen_fields` (the runtime's request schema) stays the
    source of truth: the check below the class fails the import when the two differ."""

    max_tokens: int | None = None
    min_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    regex: str | None = None
    json_schema: str | None = None
    grammar: str | None = None
    stop_regex: list[str] | None = None
    structural_tag: Any | None = None
    reasoning_parser: str | None = None
    thinking_token_budget: int | None = None
    return_logprob: bool | None = None
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    return_text_in_logprobs: bool | None = None
    dtype: str | None = None
    tool_calls: bool | None = None
    lora: str | None = None

    def merged(self, defaults: GenParams) -> GenParams:
        """These params, with unset fields taken from `defaults`."""
        return GenParams(**{f.name: v if (v := getattr(self, f.name)) is not None else getattr(defaults, f.name)
                            for f in dataclasses.fields(self)})

    def set_fields(self) -> dict[str, Any]:
        return {f.name: v for f in dataclasses.fields(self) if (v := getattr(self, f.name)) is not None}

    def sampling_params(self) -> dict[str, Any]:
        """The backend's `sampling_params` (runtime names); dtype becomes its regex."""
        out: dict[str, Any] = {}
        for name, value in self.set_fields().items():
            if name == "dtype":
                out["regex"] = DTYPE_REGEXES[value]
            elif name not in LANG_FIELDS:
                out[_RUNTIME_NAMES.get(name, name)] = value
        if self.dtype in DTYPE_STOPS:  # a number ends at a space or newline, as in SGLang
            out["stop"] = list(dict.fromkeys([*(self.stop or []), *DTYPE_STOPS[self.dtype]]))
        from .global_config import global_config  # here: the config module imports the backend, which imports this

        if not global_config.skip_special_tokens_in_output:
            out["skip_special_tokens"] = False
        return out

    def validate(self, names: Mapping[str, str] = GEN_NAMES) -> None:
        """Checks each set field's type and range (limits that depend on the model are the backend's).
        Errors spell the runtime's fields as `names` does: gen()'s names, or run()'s (the runtime's)."""
        constraints = [n for n in GEN_CONSTRAINTS if getattr(self, n) is not None]
        if len(constraints) > 1:
            raise ValueError(f"gen takes at most one of dtype, regex, json_schema and grammar, got {constraints}")
        self._validate_constraint()
        if self.lora is not None and (not isinstance(self.lora, str) or not self.lora):
            raise ValueError(f"lora must be a LoRA adapter's name, got {self.lora!r}")
        for name in ("return_logprob", "return_text_in_logprobs"):
            if getattr(self, name) not in (None, True, False):
                raise ValueError(f"{name} must be a boolean, got {getattr(self, name)!r}")
        n = self.top_logprobs_num
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 0):
            raise ValueError(f"top_logprobs_num must be an integer >= 0, got {n!r}")
        start = self.logprob_start_len
        if start is not None and (not isinstance(start, int) or isinstance(start, bool) or start < -1):
            raise ValueError(f"logprob_start_len must be an integer >= -1 (-1: no prompt logprobs), got {start!r}")
        check_fields(self.sampling_params(), names=names)
        for name in ("stop", "stop_regex"):
            if getattr(self, name) == []:
                raise ValueError(f"{name} must be a non-empty string or a non-empty list of them, got []")

    def _validate_constraint(self) -> None:
        if self.dtype is not None and self.dtype not in DTYPE_REGEXES:
            raise ValueError(f"dtype must be one of {sorted(DTYPE_REGEXES)} (or int, float, bool, str), "
                             f"got {self.dtype!r}")
        if self.regex is not None:
            if not isinstance(self.regex, str) or not self.regex:
                raise ValueError(f"regex must be a non-empty string, got {self.regex!r}")
            try:
                re.compile(self.regex)
            except re.error as e:
                raise ValueError(f"regex {self.regex!r} is not a valid regular expression: {e}") from None
        if self.json_schema is not None:
            if not isinstance(self.json_schema, str):
                raise ValueError("json_schema must be a JSON string (gen() also takes a dict or pydantic model)")
            try:
                schema = json.loads(self.json_schema)
            except json.JSONDecodeError as e:
                raise ValueError(f"json_schema is not valid JSON: {e}") from None
            if not isinstance(schema, (dict, bool)):
                raise ValueError("json_schema must be a JSON object")
        if self.structural_tag is not None:
            parse_structural_tag(self.structural_tag)  # a ValueError names the bad field
        if self.grammar is not None and (not isinstance(self.grammar, str) or not self.grammar.strip()):
            raise ValueError(f"grammar must be a non-empty Lark grammar string, got {self.grammar!r}")


_declared = list(typing.get_type_hints(GenParams).items())  # the fields' names and types, in order
if _declared != [(name, kind) for name, kind, _ in _gen_fields()]:
    raise TypeError(f"GenParams' fields {_declared} differ from the runtime's sampling schema {_gen_fields()}")
GEN_FIELDS = tuple(f.name for f in dataclasses.fields(GenParams))


def stop_list(stop: object) -> object:
    """One stop string, or a tuple of them, as a list (anything else is left to validation)."""
    if isinstance(stop, str):
        return [stop]
    return list(stop) if isinstance(stop, tuple) else stop


# run()'s sampling defaults: every gen() field but the constraints, in the runtime's names -> gen()'s
RUN_FIELDS = {_RUNTIME_NAMES.get(name, name): name for name in GEN_FIELDS
              if name not in GEN_CONSTRAINTS and name != "tool_calls"}  # a tool gen marks itself


def sampling_defaults(sampling: Mapping[str, Any] | None) -> GenParams:
    """A run's sampling defaults (SGLang's run() names, e.g. max_new_tokens) as validated GenParams."""
    sampling = {k: v for k, v in (sampling or {}).items() if v is not None}
    unknown = sorted(set(sampling) - set(RUN_FIELDS))
    if unknown:
        raise ValueError(f"unknown sampling default(s) {unknown}; known ones are {sorted(RUN_FIELDS)}")
    fields = {RUN_FIELDS[k]: v for k, v in sampling.items()}
    for name in ("stop", "stop_regex"):
        if name in fields:
            fields[name] = stop_list(fields[name])
    params = GenParams(**fields)
    params.validate(names={})
    return params
