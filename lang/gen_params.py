"""gen()'s sampling fields, as the IR stores them, and their validation."""
from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any, ClassVar

from ..runtime.config import DTYPE_REGEXES

_UNBOUNDED = 2**62  # stands in for limits only the backend knows (context length, vocabulary size)
_LANG_NAMES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}


@dataclass(slots=True)
class GenParams:
    """gen()'s sampling fields (SGLang's names); None: inherit the run's default, then the backend's."""

    max_tokens: int | None = None
    min_tokens: int | None = None
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    ignore_eos: bool | None = None
    return_logprob: bool | None = None
    top_logprobs_num: int | None = None
    return_text_in_logprobs: bool | None = None
    dtype: str | None = None
    regex: str | None = None
    json_schema: str | None = None
    grammar: str | None = None

    _REQUEST_FIELDS: ClassVar[tuple[str, ...]] = ("return_logprob", "top_logprobs_num", "return_text_in_logprobs")
    _CONSTRAINTS: ClassVar[tuple[str, ...]] = ("dtype", "regex", "json_schema", "grammar")

    def merged(self, defaults: "GenParams") -> "GenParams":
        """These params, with unset fields taken from `defaults`."""
        return GenParams(**{f.name: v if (v := getattr(self, f.name)) is not None else getattr(defaults, f.name)
                            for f in dataclasses.fields(self)})

    def set_fields(self) -> dict[str, Any]:
        return {f.name: v for f in dataclasses.fields(self) if (v := getattr(self, f.name)) is not None}

    def sampling_params(self) -> dict[str, Any]:
        """The backend's `sampling_params` (runtime names); dtype becomes its regex."""
        out: dict[str, Any] = {}
        for name, value in self.set_fields().items():
            if name in self._REQUEST_FIELDS:
                continue
            if name == "dtype":
                out["regex"] = DTYPE_REGEXES[value]
            elif name == "max_tokens":
                out["max_new_tokens"] = value
            elif name == "min_tokens":
                out["min_new_tokens"] = value
            else:
                out[name] = value
        return out

    def validate(self) -> None:
        """Checks each set field's type and range (limits that depend on the model are the backend's)."""
        from ..runtime.sampling_params import SamplingParams

        constraints = [n for n in self._CONSTRAINTS if getattr(self, n) is not None]
        if len(constraints) > 1:
            raise ValueError(f"gen takes at most one of dtype, regex, json_schema and grammar, got {constraints}")
        self._validate_constraint()
        for name in ("return_logprob", "return_text_in_logprobs"):
            if getattr(self, name) not in (None, True, False):
                raise ValueError(f"{name} must be a boolean, got {getattr(self, name)!r}")
        n = self.top_logprobs_num
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 0):
            raise ValueError(f"top_logprobs_num must be an integer >= 0, got {n!r}")
        fields = {k: v for k, v in self.sampling_params().items() if k not in ("regex", "json_schema", "grammar")}
        if "min_new_tokens" in fields:
            fields.setdefault("max_new_tokens", _UNBOUNDED)  # the run's default is not known here
        try:
            SamplingParams.from_any(fields).validate(vocab_size=_UNBOUNDED, context_length=_UNBOUNDED)
        except ValueError as e:
            message = re.sub(rf"must be in \[(-?\d+), {_UNBOUNDED}\]", r"must be >= \1", str(e))
            message = message.replace(f"token ids in [0, {_UNBOUNDED})", "token ids >= 0")
            for runtime_name, lang_name in _LANG_NAMES.items():
                message = message.replace(runtime_name, lang_name)
            raise ValueError(message) from None
        if self.stop is not None and (not isinstance(self.stop, list) or not self.stop):
            raise ValueError(f"stop must be a non-empty string or a non-empty list of them, got {self.stop!r}")

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
        if self.grammar is not None and (not isinstance(self.grammar, str) or not self.grammar.strip()):
            raise ValueError(f"grammar must be a non-empty Lark grammar string, got {self.grammar!r}")
