"""Choice methods for `select`: pick one choice from the log-probabilities of its tokens.

A method is called with SGLang's keyword arguments, so methods written for SGLang work unchanged.
Token log-probability entries are `(logprob, token_id, text_or_None)`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, Sequence

TokenLogprobs = Sequence[Sequence[Any]]  # one choice's entries


@dataclass(slots=True)
class ChoicesDecision:
    decision: str
    meta_info: dict[str, Any] | None = None


class ChoiceMethod(Protocol):
    """What select scores its choices with: a built-in below, or a callable written for SGLang."""

    def __call__(self, *, choices: list[str], normalized_prompt_logprobs: list[float],
                 input_token_logprobs: Sequence[TokenLogprobs], output_token_logprobs: Sequence[TokenLogprobs],
                 unconditional_token_logprobs: Sequence[TokenLogprobs] | None = None) -> ChoicesDecision: ...


class ChoicesSamplingMethod:
    """Base of the choice methods; subclasses implement `__call__`."""

    name: ClassVar[str] = ""
    requires_unconditional_logprobs: ClassVar[bool] = False

    def __call__(self, *, choices: list[str], normalized_prompt_logprobs: list[float],
                 input_token_logprobs: Sequence[TokenLogprobs], output_token_logprobs: Sequence[TokenLogprobs],
                 unconditional_token_logprobs: Sequence[TokenLogprobs] | None = None) -> ChoicesDecision:
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.name


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _logprobs(entries: TokenLogprobs) -> list[float]:
    return [e[0] for e in entries]


def _argmax(values: Sequence[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)  # first of equals: choices order breaks ties


class TokenLengthNormalized(ChoicesSamplingMethod):
    """The highest mean token log-probability."""

    name = "token_length_normalized"

    def __call__(self, *, choices, normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs,
                 unconditional_token_logprobs=None) -> ChoicesDecision:
        return ChoicesDecision(choices[_argmax(normalized_prompt_logprobs)], {
            "normalized_prompt_logprobs": normalized_prompt_logprobs,
            "input_token_logprobs": input_token_logprobs,
            "output_token_logprobs": output_token_logprobs,
        })


class GreedyTokenSelection(ChoicesSamplingMethod):
    """Compare choices token by token, keeping those with the best log-probability at each position.

    A choice shorter than the position being compared stands in with its mean log-probability.
    """

    name = "greedy_token_selection"

    def __call__(self, *, choices, normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs,
                 unconditional_token_logprobs=None) -> ChoicesDecision:
        rows = [_logprobs(entries) for entries in input_token_logprobs]
        width = max(len(r) for r in rows)
        matrix = [r + [_mean(r)] * (width - len(r)) for r in rows]
        alive = list(range(len(rows)))
        for j in range(width):
            best = max(matrix[i][j] for i in alive)
            alive = [i for i in alive if matrix[i][j] == best]
            if len(alive) == 1:
                break
        return ChoicesDecision(choices[alive[0]], {
            "normalized_prompt_logprobs": normalized_prompt_logprobs,
            "input_token_logprobs": input_token_logprobs,
            "output_token_logprobs": output_token_logprobs,
            "greedy_logprob_matrix": matrix,
        })


class UnconditionalLikelihoodNormalized(ChoicesSamplingMethod):
    """The highest mean of (log p(token | prompt) - log p(token | choice alone)).

    The first token has no unconditional log-probability (None); it counts as 0.
    """

    name = "unconditional_likelihood_normalized"
    requires_unconditional_logprobs = True

    def __call__(self, *, choices, normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs,
                 unconditional_token_logprobs=None) -> ChoicesDecision:
        if unconditional_token_logprobs is None:
            raise ValueError("unconditional_likelihood_normalized needs unconditional token logprobs")
        scores = []
        for cond, uncond in zip(input_token_logprobs, unconditional_token_logprobs):
            if len(cond) != len(uncond):
                raise ValueError("conditional and unconditional logprobs must cover the same tokens")
            scores.append(_mean([c[0] - (u[0] or 0.0) for c, u in zip(cond, uncond)]))
        return ChoicesDecision(choices[_argmax(scores)], {
            "normalized_prompt_logprobs": normalized_prompt_logprobs,
            "input_token_logprobs": input_token_logprobs,
            "output_token_logprobs": output_token_logprobs,
            "unconditional_token_logprobs": unconditional_token_logprobs,
            "normalized_unconditional_prompt_logprobs": scores,
        })


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()
BUILTIN_METHODS: dict[str, ChoicesSamplingMethod] = {m.name: m for m in (
    token_length_normalized, greedy_token_selection, unconditional_likelihood_normalized)}


def resolve_method(method: str | ChoiceMethod) -> ChoiceMethod:
    """A method object from a built-in name, or the given callable."""
    if isinstance(method, str):
        return _builtin(method)
    if not callable(method):
        raise TypeError(f"choices_method must be a choice method or its name, got {type(method).__name__}")
    return method


def _builtin(name: str) -> ChoicesSamplingMethod:
    if name not in BUILTIN_METHODS:
        raise ValueError(f"choice method must be one of {sorted(BUILTIN_METHODS)}, got {name!r}")
    return BUILTIN_METHODS[name]


def method_key(method: str | ChoiceMethod) -> str | ChoiceMethod:
    """What a Select node stores: a built-in's name (serializable), else the callable itself."""
    if isinstance(method, str):
        return _builtin(method).name
    name = getattr(method, "name", None)
    builtin = BUILTIN_METHODS.get(name) if isinstance(name, str) else None
    if builtin is not None and type(method) is type(builtin):
        return builtin.name
    return resolve_method(method)


def decide(method: str | ChoiceMethod, choices: list[str], scored: list[list[tuple]],
           unconditional: list[list[tuple]] | None) -> tuple[int, dict[str, Any]]:
    """Runs the choice method over per-choice token log-probabilities; returns (index, meta info)."""
    normalized = [_mean([e[0] for e in entries]) for entries in scored]
    decision = resolve_method(method)(
        choices=choices, normalized_prompt_logprobs=normalized, input_token_logprobs=scored,
        output_token_logprobs=[[] for _ in choices], unconditional_token_logprobs=unconditional)
    if decision.decision not in choices:
        raise ValueError(f"the choice method returned {decision.decision!r}, which is not one of the choices")
    meta = dict(decision.meta_info or {})
    meta.setdefault("normalized_prompt_logprobs", normalized)
    meta.setdefault("input_token_logprobs", scored)
    return choices.index(decision.decision), meta


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
