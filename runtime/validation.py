"""The edge's checks: a caller's prompts, sampling params, logprob options, ids and images become
validated `Submission`s. Every check of a request happens here, once: `RequestValidator.build` is the
one call (server/ calls it directly; `Engine.prepare` for Python callers), and the sampling fields are
checked against the rules `sampling_params.py` declares."""
from __future__ import annotations

import dataclasses
import math
import re
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence, TypeGuard

from .config import MAX_STOP_REGEX_LEN
from .lora import UnknownAdapter
from .namespace import DEFAULT_NAMESPACE, Namespace
from .reasoning_formats import PROMPT_TAIL_TOKENS, prompt_phase, reasoning_format
from .sampling_params import ALIASES, CONSTRAINT_FIELDS, RULES, UNSUPPORTED, Rule, SamplingParams
from .submission import Retention, Submission, SubmissionBatch, sample_rids

if TYPE_CHECKING:  # types only: checking a request needs no torch (lang checks gen()'s fields with check_fields)
    from .constrained.compiler import ConstraintCompiler
    from .constrained.matcher import Constraint
    from .image_span import ImageSpan
    from .lora.adapter import LoraAdapter
    from .lora.pool import LoraPool
    from .multimodal.prompt import ImagePrompts
    from .tokenizer import Tokenizer

SamplingArg = SamplingParams | Mapping[str, Any] | None
Prompts = str | Sequence[str] | None
InputIds = Sequence[int] | Sequence[Sequence[int]] | None
Bound = float | str  # a range's end: a number, or (a limit not known yet) the limit's name as the caller spells it


@dataclass
class RequestValidator:
    """Checks requests against one loaded model's limits (vocabulary, context, KV pool, vision)."""

    tokenizer: Tokenizer
    model_name: str
    vocab_size: int
    context_length: int
    pool_size: int
    constraints: ConstraintCompiler
    image_prompts: ImagePrompts | None = None  # None: a text-only model
    share_prefills: bool = True  # False without a radix cache: samples cannot share a prompt's KV
    reasoning_parser: str | None = None  # the model's (engine option): a thinking_token_budget alone uses it
    adapters: LoraPool | None = None  # the LoRA adapters requests may name; None: the model serves none

    def build(self, prompt: Prompts = None, sampling_params: SamplingArg = None, *, input_ids: InputIds = None,
              return_logprob: bool = False, logprob_start_len: int = -1, top_logprobs_num: int = 0,
              rid: str | Sequence[str] | None = None, retain: Retention | str | None = None,
              priority: int = 0, names: Mapping[str, str] | None = None,
              image_data: object = None, namespace: Namespace = DEFAULT_NAMESPACE,
              lora: str | Sequence[str | None] | None = None) -> SubmissionBatch:
        """The requests of one call: one per prompt and sample, prompt-major. `image_data`: a vision
        model's images (paths, bytes, data URLs, PIL images), one per placeholder
        (`image_prompts.placeholder`); for a batch, one list per prompt. `retain`: keep each finished
        sequence pinned (a str: a session key, OpenAI's prompt_cache_key). `priority`: SGLang's (larger
        first; see runtime/scheduling/schedule_policy.py). `namespace`: the requests reuse KV only within it
        (runtime/namespace.py). `lora`: a loaded LoRA adapter's name, or one (or None) per prompt (UnknownAdapter
        for one not loaded). Errors name a sampling field
        as `names` spells it. The sampling params are checked first, then compiled (a constraint)."""
        params = parse_params(sampling_params)
        check_params(params, self.vocab_size, self.context_length, names)
        spec = params.constraint
        constraint = self.constraints.compile(*spec) if spec is not None else None
        prompts, single = self._prompt_ids(prompt, input_ids)
        constraints = self._thinking_first(params, constraint, prompts, names or {})
        images, starts = self._images(prompts, image_data, logprob_start_len)
        if not isinstance(top_logprobs_num, int) or not 0 <= top_logprobs_num <= self.vocab_size:
            raise ValueError(f"top_logprobs_num must be in [0, {self.vocab_size}], got {top_logprobs_num!r}")
        if not isinstance(logprob_start_len, int) or logprob_start_len < -1:
            raise ValueError(f"logprob_start_len must be an integer >= -1, got {logprob_start_len!r}")
        if isinstance(retain, str):
            if not retain:
                raise ValueError("prompt_cache_key must be a non-empty string")
            retain = Retention.session(retain)
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ValueError(f"priority must be an integer, got {priority!r}")
        adapters = self._adapters(lora, len(prompts))
        prompt_rids = self._rids(rid, len(prompts))
        rids = sample_rids(prompt_rids, params.n)
        subs = []
        for i, ids in enumerate(prompts):
            adapter = adapters[i]
            # an adapter's KV is never another adapter's or the base's: a namespace per adapter (and per load)
            space = namespace if adapter is None else namespace.child("adapter", adapter.key)
            for j in range(params.n):
                subs.append(Submission(rids[i * params.n + j], ids, _sample_params(params, j), return_logprob,
                                       starts[i], top_logprobs_num, constraints[i], images[i], retain,
                                       priority, space, adapter))
        return SubmissionBatch(subs, prompt_rids, single, params.n, self._shared_prefills(subs))

    def _adapters(self, lora: str | Sequence[str | None] | None, num_prompts: int) -> list[LoraAdapter | None]:
        """Each prompt's LoRA adapter (None: the base model)."""
        names = [lora] * num_prompts if lora is None or isinstance(lora, str) else list(lora)
        if len(names) != num_prompts or not all(n is None or isinstance(n, str) for n in names):
            raise ValueError(f"lora must be an adapter's name, or one name (or null) per prompt ({num_prompts})")
        out: list[LoraAdapter | None] = []
        for name in names:
            if name is not None and self.adapters is None:
                raise UnknownAdapter(name, [])
            out.append(None if name is None or self.adapters is None else self.adapters.lookup(name))
        return out

    def _thinking_first(self, params: SamplingParams, constraint: Constraint | None, prompts: list[list[int]],
                        names: Mapping[str, str]) -> list[Constraint | None]:
        """Each prompt's constraint: with a reasoning parser and a constraint or a thinking budget, the
        thinking block comes first (constrained/think.py), from where the prompt leaves the model."""
        budget, parser = params.thinking_token_budget, params.reasoning_parser
        if parser is None and budget is not None:
            parser = self.reasoning_parser
        if parser is None:
            if budget is not None:
                label = names.get("thinking_token_budget", "thinking_token_budget")
                raise FieldError(label, f"{label} needs a reasoning model: start the server with --reasoning-parser "
                                        "(or pass reasoning_parser)")
            return [constraint] * len(prompts)
        try:
            fmt = reasoning_format(parser)
        except ValueError as e:
            raise FieldError(names.get("reasoning_parser", "reasoning_parser"), str(e)) from None
        if constraint is None and budget is None:
            return [None] * len(prompts)
        out: list[Constraint | None] = []
        for ids in prompts:
            phase = prompt_phase(fmt, self.tokenizer.decode(ids[-PROMPT_TAIL_TOKENS:], skip_special_tokens=False))
            out.append(constraint if phase == "answer" else
                       self.constraints.think_then(constraint, fmt.start, fmt.end, budget, phase == "think"))
        return out

    def _images(self, prompts: list[list[int]], image_data: object,
                logprob_start_len: int) -> tuple[list[list[ImageSpan]], list[int]]:
        """Expands each prompt's image placeholders into spans (in place); returns the spans and each
        prompt's logprob_start_len in the expanded prompt. `image_data`: images of one prompt, or one
        list per prompt."""
        if image_data is None or (isinstance(image_data, (list, tuple)) and not image_data):
            return [[] for _ in prompts], [logprob_start_len] * len(prompts)
        if self.image_prompts is None:
            raise ValueError(f"model {self.model_name!r} has no vision tower, so it takes no images")
        spans, starts = [], []
        for i, (ids, sources) in enumerate(zip(prompts, images_per_prompt(image_data, len(prompts)))):
            where = "image_data" if len(prompts) == 1 else f"image_data[{i}]"
            ids[:], found, start = self.image_prompts.expand(ids, sources, where, logprob_start=logprob_start_len)
            self._check_length(ids)
            spans.append(found)
            starts.append(start)
        return spans, starts

    def _prompt_ids(self, prompt: Prompts, input_ids: InputIds) -> tuple[list[list[int]], bool]:
        if (prompt is None) == (input_ids is None):
            raise ValueError("pass exactly one of prompt and input_ids")
        if prompt is not None:
            single = isinstance(prompt, str)
            texts = [prompt] if isinstance(prompt, str) else list(prompt)
            if not all(isinstance(t, str) for t in texts):
                raise ValueError("prompt must be a string or a list of strings")
            batch = [self.tokenizer.encode(t) if t else [] for t in texts]
        else:
            assert input_ids is not None
            single = bool(input_ids) and not isinstance(input_ids[0], (list, tuple))
            # the first item told the shape, which the static union cannot follow: ids, or rows of them
            batch = [list(input_ids)] if single else [list(x) for x in input_ids]  # type: ignore[arg-type]
        if not batch:
            raise ValueError("no prompts given")
        for ids in batch:
            self._check_prompt(ids)
        return batch, single

    def _check_prompt(self, ids: list[int]) -> None:
        if not ids:
            raise ValueError("prompt is empty")
        if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < self.vocab_size for t in ids):
            raise ValueError(f"input_ids must be token ids in [0, {self.vocab_size})")
        self._check_length(ids)

    def _check_length(self, ids: list[int]) -> None:
        if len(ids) >= self.context_length:
            raise ValueError(
                f"prompt has {len(ids)} tokens; the context holds {self.context_length}, "
                "so a prompt may have at most one token fewer"
            )
        if len(ids) + 1 > self.pool_size:
            raise ValueError(f"prompt has {len(ids)} tokens but the KV pool holds only {self.pool_size}")

    @staticmethod
    def _rids(rid: str | Sequence[str] | None, num_prompts: int) -> list[str]:
        """Each prompt's request id: given (one non-empty, distinct string per prompt) or fresh."""
        if rid is None:
            return [uuid.uuid4().hex for _ in range(num_prompts)]
        given = [rid] if isinstance(rid, str) else list(rid)
        if len(given) != num_prompts or not all(isinstance(r, str) and r for r in given):
            raise ValueError(f"rid must be one non-empty string per prompt ({num_prompts})")
        if len(set(given)) != len(given):
            raise ValueError("rid must be unique within a request (one id per prompt), got duplicates")
        return given

    def _shared_prefills(self, subs: list[Submission]) -> list[Submission]:
        """For n > 1, the prompts computed once up front, so the n samples share their KV."""
        if not self.share_prefills:
            return []
        # The same ids share KV only within one namespace (a tenant, an adapter) and with the same images.
        seen: dict[tuple[object, ...], Submission] = {}
        for s in subs:
            seen.setdefault((tuple(s.prompt_ids), s.namespace, tuple(i.key for i in s.images)), s)
        if len(seen) == len(subs):
            return []
        return [Submission(uuid.uuid4().hex, s.prompt_ids, SamplingParams(max_new_tokens=0), images=s.images,
                           priority=s.priority, namespace=s.namespace, lora=s.lora)
                for s in seen.values()]


def images_per_prompt(image_data: object, num_prompts: int) -> list[list[object]]:
    """One list of image sources per prompt, from one prompt's list (or one image) or a list of lists."""
    items = list(image_data) if isinstance(image_data, (list, tuple)) else [image_data]
    lists = [list(x) for x in items if isinstance(x, (list, tuple))]
    nested = isinstance(image_data, (list, tuple)) and len(lists) == len(items)
    if num_prompts == 1 and not nested:
        return [items]
    if not nested or len(lists) != num_prompts:
        raise ValueError(f"image_data must hold one list of images per prompt ({num_prompts})")
    return lists


def _sample_params(params: SamplingParams, j: int) -> SamplingParams:
    """Sample j's params: n=1, and a given seed offset by j so samples differ but repeat."""
    if params.n == 1:
        return params
    p = parse_params(params)
    p.n = 1
    p.seed = None if params.seed is None else params.seed + j
    return p


# ---- sampling params: parsed from what a caller sent, checked against sampling_params' rules ---------
def parse_params(params: SamplingParams | Mapping[str, Any] | None) -> SamplingParams:
    """A caller's sampling params (a dict of SGLang's names, or SamplingParams: copied) as SamplingParams;
    unknown names are refused. Values are not checked yet: `check_params` does that."""
    if params is None:
        return SamplingParams()
    if isinstance(params, SamplingParams):
        return dataclasses.replace(params, stop=list(params.stop), stop_token_ids=list(params.stop_token_ids),
                                   stop_regex=list(params.stop_regex))
    if not isinstance(params, Mapping):
        raise TypeError(f"sampling_params must be a dict or SamplingParams, got {type(params).__name__}")
    known = {f.name for f in dataclasses.fields(SamplingParams)}
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
    return SamplingParams(**values)


def check_params(params: SamplingParams, vocab_size: int | None, context_length: int | None,
                 names: Mapping[str, str] | None = None) -> None:
    """Checks every field; an error names a field as `names` spells it (default: as SamplingParams does)."""
    values = {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}
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
            vocab = _bound(rule.hi_ids if rule.hi_ids is not None else math.inf, limits, names)
            _check_bias(label, value, rule, lo, hi, vocab)
        elif rule.kind == "unsupported":
            _check_unsupported(name, label, value)
        else:
            _CHECKS[rule.kind](label, value, rule, lo, hi)
    given = [name for name in CONSTRAINT_FIELDS if values.get(name) is not None]
    if len(given) > 1:
        spelled = [names.get(n, n) for n in given]
        raise FieldError(spelled[1], f"{' and '.join(spelled)} are exclusive: use at most one")


def _bound(bound: Bound, limits: Mapping[str, Any], names: Mapping[str, str]) -> Bound:
    """A numeric bound, a known limit's value, or (unknown yet) the limit's name as the caller spells it."""
    if not isinstance(bound, str):
        return bound
    value = limits.get(bound)
    return names.get(bound, bound) if value is None else value


def _in_range(value: float, rule: Rule, lo: Bound, hi: Bound) -> bool:
    above = isinstance(lo, str) or (value > lo if rule.lo_open else value >= lo)
    return above and (isinstance(hi, str) or value <= hi)


def _range_error(label: str, value: object, rule: Rule, lo: Bound, hi: Bound) -> FieldError:
    return FieldError(label, f"{label} must be in {'(' if rule.lo_open else '['}{lo}, {hi}], got {value}")


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(label: str, value: object, rule: Rule, lo: Bound, hi: Bound) -> None:
    if not _is_int(value):
        raise FieldError(label, f"{label} must be an integer, got {value!r}")
    if not _in_range(value, rule, lo, hi):
        raise _range_error(label, value, rule, lo, hi)


def _check_float(label: str, value: object, rule: Rule, lo: Bound, hi: Bound) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise FieldError(label, f"{label} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise FieldError(label, f"{label} must be a finite number, got {value!r}")
    if not _in_range(value, rule, lo, hi):
        raise _range_error(label, value, rule, lo, hi)


def _check_bool(label: str, value: object, rule: Rule, lo: Bound, hi: Bound) -> None:
    if not isinstance(value, bool):
        raise FieldError(label, f"{label} must be a boolean, got {value!r}")


def _check_strings(label: str, value: object, rule: Rule, lo: Bound, hi: Bound) -> None:
    _strings(label, value)


def _strings(label: str, value: object) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
        raise FieldError(label, f"{label} must be a non-empty string or a list of them, got {value!r}")
    return value


def _check_token_ids(label: str, value: object, rule: Rule, lo: Bound, hi: Bound) -> None:
    if not isinstance(value, list) or not all(_is_int(t) and 0 <= t and (isinstance(hi, str) or t < hi)
                                              for t in value):
        raise FieldError(label, f"{label} must be token ids in [0, {hi}), got {value!r}")


def _check_text(label: str, value: object, rule: Rule, lo: Bound, hi: Bound) -> None:
    if value is not None and not isinstance(value, str):
        raise FieldError(label, f"{label} must be a string, got {type(value).__name__}")


def _check_optional_int(label: str, value: object, rule: Rule, lo: Bound, hi: Bound) -> None:
    if value is not None:
        _check_int(label, value, rule, lo, hi)


def _check_regexes(label: str, value: object, rule: Rule, lo: Bound, hi: Bound) -> None:
    for pattern in _strings(label, value):
        if len(pattern.encode()) > MAX_STOP_REGEX_LEN:
            raise FieldError(label, f"{label}: a pattern may be at most {MAX_STOP_REGEX_LEN} bytes, got "
                                    f"{len(pattern.encode())}")
        try:
            compiled = re.compile(pattern)
        except re.error as e:
            raise FieldError(label, f"{label}: {pattern!r} is not a valid regular expression: {e}") from None
        if compiled.match("") is not None:
            raise FieldError(label, f"{label}: {pattern!r} matches the empty string, so it would stop at once")


def _check_bias(label: str, value: object, rule: Rule, lo: Bound, hi: Bound, vocab: Bound) -> None:
    """OpenAI's and SGLang's logit_bias: {"token id": bias}, each bias in [lo, hi]."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise FieldError(label, f"{label} must be an object of token id -> bias, got {type(value).__name__}")
    for key, bias in value.items():
        token = int(key) if isinstance(key, str) and key.isdigit() else key if _is_int(key) else None
        if token is None or (not isinstance(vocab, str) and not 0 <= token < vocab):
            raise FieldError(label, f"{label} keys must be token ids in [0, {vocab}), got {key!r}")
        if not isinstance(bias, (int, float)) or isinstance(bias, bool) or not _in_range(bias, rule, lo, hi):
            raise FieldError(label, f"{label}[{key!r}] must be a number in [{lo}, {hi}], got {bias!r}")


def _check_json_object(label: str, value: object, rule: Rule, lo: Bound, hi: Bound) -> None:
    if value is not None and not (isinstance(value, dict) and all(isinstance(k, str) for k in value)):
        raise FieldError(label, f"{label} must be a JSON object, got {type(value).__name__}")


def _check_unsupported(name: str, label: str, value: object) -> None:
    allowed, reason = UNSUPPORTED[name]
    if not any(value is a or (a is not None and value == a and _is_int(value)) for a in allowed):
        raise FieldError(label, f"{label}={value!r}: {reason}")


_CHECKS = {"int": _check_int, "optional_int": _check_optional_int, "regexes": _check_regexes,
           "json_object": _check_json_object, "float": _check_float, "bool": _check_bool, "seed": _check_optional_int,
           "strings": _check_strings, "token_ids": _check_token_ids, "text": _check_text,
           "any": lambda *_: None}
