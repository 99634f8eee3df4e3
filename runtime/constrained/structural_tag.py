"""Structural tags: free text, with constrained parts where a trigger marker appears (XGrammar's idea).

A tag is (begin marker, JSON schema, end marker). In *triggered* mode the output is free text until one
of the trigger strings appears; from there the text must continue as one tag whose begin starts with
that trigger (begin, a value valid for its schema, end), and then it is free again. In *separator* mode
the output is only tags, joined by a separator (tool_choice "required": calls and nothing else).

The whole language is one regex tree over the JSON schemas' trees: `(F T)* F` with `F` the texts that
contain no trigger and `T` the alternation of the tags. It compiles like a JSON schema (one DFA when
every schema is regular, else rules for the LALR engine), so token masks come from the token index and
jump-forward works inside the tags: markers, key names and the rest of a begin after its trigger are
forced bytes, drafted in one step.

Accepted spellings (what SGLang and vLLM accept in `response_format` and `structural_tag`):
- legacy: {"type": "structural_tag", "structures": [{"begin", "schema", "end"}...], "triggers": [...]}
- XGrammar's format: {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": [...],
  "tags": [{"type": "tag", "begin", "content": {"type": "json_schema", "json_schema": {...}}, "end"}...],
  "at_least_one": bool, "stop_after_first": bool}}, or "tags_with_separator" with "separator" instead
  of "triggers".
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from .jsonschema.json_schema import JsonGrammar, Relaxed, compile_json_schema, schema_to_dict
from .regex import regex_ast as ra
from .regex.automaton import difference

ANY_CHAR = ra.chars([(0, 0x10FFFF)])
ANY_TEXT = ra.repeat(ANY_CHAR, 0, None)
FIELD = "structural_tag"


@dataclass(frozen=True, slots=True)
class Tag:
    begin: str
    schema: dict | bool  # a JSON schema
    end: str


@dataclass(frozen=True, slots=True)
class StructuralTag:
    tags: tuple[Tag, ...]
    triggers: tuple[str, ...] | None  # None: separator mode (tags only)
    separator: str = ""
    at_least_one: bool = False  # at least one tag (separator mode: the output is not empty)
    stop_after_first: bool = False  # the output ends after the first tag

    def canonical(self) -> str:
        """The cache key: one text per language."""
        return json.dumps(dataclasses.asdict(self))  # in order: a schema's property order matters


def parse_structural_tag(spec: object) -> StructuralTag:
    """A structural tag from a dict or JSON string in either spelling; ValueError names the bad field."""
    if isinstance(spec, StructuralTag):
        return spec
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as e:
            raise ValueError(f"{FIELD} is not valid JSON: {e}") from None
    if not isinstance(spec, dict):
        raise ValueError(f"{FIELD} must be an object, got {type(spec).__name__}")
    if spec.get("type", FIELD) != FIELD:
        raise ValueError(f"{FIELD}.type must be 'structural_tag', got {spec.get('type')!r}")
    if "format" in spec:
        _only(spec, {"type", "format"}, FIELD)
        return _parse_format(spec["format"], f"{FIELD}.format")
    _only(spec, {"type", "structures", "triggers"}, FIELD)
    structures = _list(spec.get("structures"), f"{FIELD}.structures")
    tags = tuple(_legacy_tag(s, f"{FIELD}.structures[{i}]") for i, s in enumerate(structures))
    triggers = tuple(_text(t, f"{FIELD}.triggers[{i}]") for i, t in enumerate(_list(spec.get("triggers"),
                                                                                   f"{FIELD}.triggers")))
    return _checked(StructuralTag(tags, triggers), FIELD)


def _parse_format(fmt: object, where: str) -> StructuralTag:
    if not isinstance(fmt, dict) or fmt.get("type") not in ("triggered_tags", "tags_with_separator"):
        raise ValueError(f"{where}.type must be 'triggered_tags' or 'tags_with_separator'")
    triggered = fmt["type"] == "triggered_tags"
    extra = "triggers" if triggered else "separator"
    _only(fmt, {"type", "tags", "at_least_one", "stop_after_first", extra}, where)
    tags = tuple(_format_tag(t, f"{where}.tags[{i}]") for i, t in enumerate(_list(fmt.get("tags"), f"{where}.tags")))
    flags = {k: fmt.get(k, False) for k in ("at_least_one", "stop_after_first")}
    for k, v in flags.items():
        if not isinstance(v, bool):
            raise ValueError(f"{where}.{k} must be a boolean, got {v!r}")
    if triggered:
        triggers = tuple(_text(t, f"{where}.triggers[{i}]") for i, t in enumerate(_list(fmt.get("triggers"),
                                                                                       f"{where}.triggers")))
        return _checked(StructuralTag(tags, triggers, **flags), where)
    separator = fmt.get("separator", "")
    if not isinstance(separator, str):
        raise ValueError(f"{where}.separator must be a string")
    return _checked(StructuralTag(tags, None, separator, **flags), where)


def _legacy_tag(s: object, where: str) -> Tag:
    if not isinstance(s, dict):
        raise ValueError(f"{where} must be an object with begin, schema and end")
    _only(s, {"begin", "schema", "end"}, where)
    return Tag(_text(s.get("begin"), f"{where}.begin"), schema_to_dict(s.get("schema", True), f"{where}.schema"),
               _text(s.get("end", ""), f"{where}.end", empty=True))


def _format_tag(t: object, where: str) -> Tag:
    if not isinstance(t, dict) or t.get("type", "tag") != "tag":
        raise ValueError(f"{where} must be an object of type 'tag'")
    _only(t, {"type", "begin", "content", "end"}, where)
    content = t.get("content")
    if not isinstance(content, dict) or content.get("type") != "json_schema" or "json_schema" not in content:
        raise ValueError(f"{where}.content must be {{'type': 'json_schema', 'json_schema': {{...}}}}")
    return Tag(_text(t.get("begin"), f"{where}.begin"), schema_to_dict(content["json_schema"], f"{where}.content.json_schema"),
               _text(t.get("end", ""), f"{where}.end", empty=True))


def _checked(tag: StructuralTag, where: str) -> StructuralTag:
    if not tag.tags:
        raise ValueError(f"{where} needs at least one tag")
    if tag.triggers is not None:
        if not tag.triggers:
            raise ValueError(f"{where}.triggers needs at least one trigger")
        for i, t in enumerate(tag.tags):
            if not any(t.begin.startswith(trigger) for trigger in tag.triggers):
                raise ValueError(f"{where}: tag {i}'s begin {t.begin!r} starts with none of the triggers")
    return tag


def _only(obj: dict, allowed: set[str], where: str) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise ValueError(f"{where} has unknown field(s) {unknown}; allowed: {sorted(allowed)}")


def _list(value: object, where: str) -> list:
    if not isinstance(value, list):
        raise ValueError(f"{where} must be a list")
    return value


def _text(value: object, where: str, empty: bool = False) -> str:
    if not isinstance(value, str) or (not value and not empty):
        raise ValueError(f"{where} must be a {'' if empty else 'non-empty '}string")
    return value


# ---- the language -----------------------------------------------------------------------------------
def structural_tag_grammar(tag: StructuralTag, whitespace: str | None = None, relaxed: Relaxed = ()) -> JsonGrammar:
    """The tag's language as one root (plus rules when a schema recurses), like a JSON schema's."""
    rules: dict[str, ra.Node] = {}
    bodies = []
    for i, t in enumerate(tag.tags):
        try:
            # the strict form, as tool calls use it: declared order, so keys are forced (jump-forward)
            grammar = compile_json_schema(t.schema, whitespace, relaxed, strict=True)
        except ValueError as e:
            raise ValueError(f"{FIELD}: tag {i} ({t.begin!r}): {e}") from None
        prefix = f"tag{i}:"
        rules |= {prefix + name: _renamed(body, prefix) for name, body in grammar.rules.items()}
        bodies.append(ra.seq(ra.literal(t.begin), _renamed(grammar.root, prefix), ra.literal(t.end)))
    any_tag = ra.alt(*bodies)
    return JsonGrammar(_root(tag, any_tag), rules)


def _root(tag: StructuralTag, any_tag: ra.Node) -> ra.Node:
    if tag.triggers is None:
        if tag.stop_after_first:
            many = any_tag
        else:
            many = ra.seq(any_tag, ra.repeat(ra.seq(ra.literal(tag.separator), any_tag), 0, None))
        return many if tag.at_least_one else ra.optional(many)
    free = free_text(tag.triggers)
    if tag.stop_after_first:
        once = ra.seq(free, any_tag)
        return once if tag.at_least_one else ra.alt(once, free)
    loop = ra.repeat(ra.seq(free, any_tag), 1 if tag.at_least_one else 0, None)
    return ra.seq(loop, free)


def free_text(triggers: tuple[str, ...]) -> ra.Node:
    """Every text that contains none of the triggers."""
    containing = ra.seq(ANY_TEXT, ra.alt(*(ra.literal(t) for t in triggers)), ANY_TEXT)
    return ra.Compiled(difference(ANY_TEXT, containing))


def _renamed(node: ra.Node, prefix: str) -> ra.Node:
    """`node` with every rule reference prefixed (each tag's rules live in one namespace)."""
    if not ra.refs(node):
        return node
    if isinstance(node, ra.Ref):
        return ra.Ref(prefix + node.name)
    if isinstance(node, ra.Seq | ra.Alt):
        return type(node)(tuple(_renamed(x, prefix) for x in node.items))
    if isinstance(node, ra.Repeat | ra.Bounded):
        return dataclasses.replace(node, item=_renamed(node.item, prefix))
    assert isinstance(node, ra.Graph), f"unexpected node {node!r}"
    return ra.Graph(node.num_states, tuple((s, _renamed(x, prefix), d) for s, x, d in node.edges), node.finals)


def split_tagged(text: str, tag: StructuralTag) -> list[tuple[int | None, str]]:
    """The output cut into (None, free text) and (tag index, the JSON between its begin and end) parts,
    as the constraint produced it (a parser for the generated text, and the tests' oracle input)."""
    parts: list[tuple[int | None, str]] = []
    pos = 0
    while pos < len(text):
        hit = _next_tag(text, pos, tag)
        if hit is None:
            parts.append((None, text[pos:]))
            break
        start, i = hit
        if start > pos:
            parts.append((None, text[pos:start]))
        body_start = start + len(tag.tags[i].begin)
        end = _json_end(text, body_start)
        parts.append((i, text[body_start:end]))
        pos = end + len(tag.tags[i].end)
        if tag.triggers is None:
            pos += len(tag.separator) if text.startswith(tag.separator, pos) else 0
    return parts


def _next_tag(text: str, pos: int, tag: StructuralTag) -> tuple[int, int] | None:
    """The first place at or after `pos` where a tag begins, and which tag (the longest begin that fits)."""
    best: tuple[int, int] | None = None
    for i, t in enumerate(tag.tags):
        at = text.find(t.begin, pos)
        if at >= 0 and (best is None or at < best[0] or (at == best[0] and len(t.begin) > len(tag.tags[best[1]].begin))):
            best = (at, i)
    return best


def _json_end(text: str, start: int) -> int:
    """Where the JSON value starting at `start` (after optional whitespace) ends."""
    decoder = json.JSONDecoder()
    skip = len(text[start:]) - len(text[start:].lstrip())
    try:
        _, end = decoder.raw_decode(text, start + skip)
    except json.JSONDecodeError:
        return len(text)
    return end
