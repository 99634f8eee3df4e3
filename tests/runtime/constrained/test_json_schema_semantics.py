"""The schema's own object semantics (the default) against the `jsonschema` library on every object of a
small universe: declared properties in any order, undeclared ones where `additionalProperties` allows
them (anywhere, but after the declared ones in a small object of one regex, nesting two levels at most); the
strict form (OpenAI's) keeps declared order and closed objects; a large object with a maxProperties
keeps its declared order and says so (one without takes any order: test_object_dispatch)."""
from __future__ import annotations

import itertools
import json
import sys

import jsonschema
import numpy as np
import pytest

from radixlang.runtime.constrained.jsonschema.json_objects import ANY_ORDER_MAX_PROPERTIES
from radixlang.runtime.constrained.jsonschema.json_schema import compile_json_schema

from .test_json_schema import complete_outputs
from .test_json_schema_keywords import accepts

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 1},
                                           "b": {"enum": ["x", "y"]}, "c": {"type": "boolean"}},
          "required": ["a", "b"]}
# members as text, each valid or not for its property; "z" is undeclared, with flat and nested values
MEMBERS = {"a": ['"a":1', '"a":7'], "b": ['"b":"x"', '"b":"q"'], "c": ['"c":true'],
           "z": ['"z":null', '"z":[1,"s"]', '"z":{"k":[2]}', '"z":{"k":[[2]]}']}


def unique_keys(text: str) -> bool:
    """Whether no object in `text` holds a key twice."""
    seen = []
    json.loads(text, object_pairs_hook=lambda pairs: seen.append(len(pairs) == len(dict(pairs))) or dict(pairs))
    return all(seen)


def universe(names: str) -> list[str]:
    """Every object holding some of `names` (each at most once), in every order, with every value."""
    out = []
    for k in range(len(names) + 1):
        for keys in itertools.permutations(names, k):
            for members in itertools.product(*(MEMBERS[n] for n in keys)):
                out.append("{" + ",".join(members) + "}")
    return out


@pytest.mark.parametrize("schema", [SCHEMA, {**SCHEMA, "additionalProperties": False},
                                    {**SCHEMA, "additionalProperties": {"type": "null"}}])
def test_default_semantics_accept_exactly_the_valid_objects(compiler, schema):
    constraint = compiler.compile("json_schema", schema)
    for text in universe("abcz"):
        value = json.loads(text)
        valid = jsonschema.Draft202012Validator(schema).is_valid(value)
        # a small object built up front in one regex: undeclared members of any value follow the declared
        # ones (a copy of their value per set written would not fit), nesting two levels at most
        keys = list(value)
        tail = "z" not in keys or keys[-1] == "z" or "additionalProperties" in schema  # null: small, anywhere
        nested = '{"k":[[' in text
        assert accepts(constraint, text) == (valid and tail and not nested), text


def test_duplicate_and_escaped_keys_are_refused(compiler):
    constraint = compiler.compile("json_schema", SCHEMA)
    assert accepts(constraint, '{"b":"x","a":0,"z":1}')
    assert not accepts(constraint, '{"a":1,"b":"x","a":0}'), "a declared property twice"
    assert not accepts(constraint, '{"a":1,"b":"x","\\u0063":5}'), "an escaped declared name is not undeclared"


def test_strict_form_keeps_declared_order_and_closed_objects(compiler):
    constraint = compiler.compile("json_schema_strict", SCHEMA)
    for text in universe("abcz"):
        value = json.loads(text)
        ordered = list(value) == [k for k in SCHEMA["properties"] if k in value]
        expected = jsonschema.Draft202012Validator({**SCHEMA, "additionalProperties": False}).is_valid(value)
        assert accepts(constraint, text) == (expected and ordered), text


def test_a_large_counted_object_keeps_declared_order_and_reports_it(compiler, walk):
    """maxProperties: a large object is not built lazily (object_dispatch counts no members)."""
    n = ANY_ORDER_MAX_PROPERTIES + 1
    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer", "minimum": 0, "maximum": 9} for i in range(n)},
              "required": ["p0"], "maxProperties": 5}
    grammar = compile_json_schema(schema)
    assert grammar.unenforced == ("property order at #",)
    constraint = compiler.compile("json_schema", schema)
    assert constraint.unenforced == ("property order at #",)
    assert accepts(constraint, '{"p0":1,"p3":2,"extra":"e"}') and not accepts(constraint, '{"p3":2,"p0":1}')
    assert accepts(constraint, '{"extra":"e","p0":1,"more":[1],"p3":2}'), "undeclared members anywhere"
    closed = {**schema, "additionalProperties": False}  # random undeclared keys would rarely close
    for text in complete_outputs(compiler.compile("json_schema", closed), walk, seed=1, wanted=6):
        jsonschema.validate(json.loads(text), closed)


def test_recursive_open_objects_take_any_order_and_any_undeclared_value(compiler):
    node = {"type": "object", "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 9},
                                             "kids": {"type": "array", "items": {"$ref": "#"}}}, "required": ["v"]}
    constraint = compiler.compile("json_schema", node)
    texts = ['{"kids":[{"q":{"d":[[[1]]]},"v":2}],"v":1}', '{"x":1,"v":3}', '{"v":1,"kids":[],"x":{}}',
             '{"v":1,"v":2}', '{"kids":[]}', '{"v":1,"kids":[{"kids":[]}]}', '{"v":10}']
    for text in texts:
        valid = jsonschema.Draft202012Validator(node).is_valid(json.loads(text)) and unique_keys(text)
        assert accepts(constraint, text) == valid, text


def test_any_value_maps_nest_freely_and_extras_beside_declared_members_nest_two_levels(compiler):
    """`additionalProperties: true` beside declared members is bounded as the unsaid default (one regex);
    a map of any values (nothing declared) holds any JSON (a grammar)."""
    open_map = {"type": "object", "additionalProperties": True}
    beside = {"type": "object", "properties": {"p": {"type": "integer"}}, "additionalProperties": True}
    for schema, text, nests in ((open_map, '{"a":{"b":[[{"c":[1]}]]}}', True),
                                (beside, '{"p":1,"z":{"k":[1]}}', True), (beside, '{"p":1,"z":{"k":[[1]]}}', False)):
        assert jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
        assert accepts(compiler.compile("json_schema", schema), text) == nests, text


def test_a_schema_whose_one_dfa_passes_its_bound_compiles_in_the_strict_form_and_says_so(compiler, monkeypatch):
    """Past JSON_REGEX_MAX_STATES the schema's DFA is not finished (it would take seconds): the strict form
    compiles instead, reported; within the bound the same schema keeps its own semantics."""
    from radixlang.runtime.constrained import compiler as compiler_module
    from radixlang.runtime.constrained.compiler import ConstraintCompiler

    schema = {**SCHEMA, "properties": {**SCHEMA["properties"], "d": {"type": "string", "pattern": "^[a-f]{2,9}$"}}}
    out_of_order = '{"b":"x","a":1}'
    assert jsonschema.Draft202012Validator(schema).is_valid(json.loads(out_of_order))
    own = ConstraintCompiler(lambda: compiler.vocab).compile("json_schema", schema)
    assert accepts(own, out_of_order) and not own.unenforced
    monkeypatch.setattr(compiler_module, "JSON_REGEX_MAX_STATES", 50)
    bounded = ConstraintCompiler(lambda: compiler.vocab).compile("json_schema", schema)
    assert bounded.unenforced[0].startswith("any property order and undeclared properties (strict form: ")
    assert "exceeds 50 states" in bounded.unenforced[0]
    assert accepts(bounded, '{"a":1,"b":"x"}') and not accepts(bounded, out_of_order)


def _notification(kind: str, data: dict | None) -> dict:
    props: dict = {"id": {"type": "string"}, "type": {"const": kind}}
    if data is not None:
        props["data"] = data
    return {"type": "object", "required": list(props), "additionalProperties": False, "properties": props}


def test_a_union_of_large_objects_and_objects_holding_rules_reads_every_branch(compiler, monkeypatch):
    """Alternatives that start alike, some of one lexeme (large pieces: rules of their own) and some holding
    rules, are all split where they start, so the lexer never reads on into one kind only. Before, a grammar's
    large pieces were taken for alternatives holding rules and never split: after `{` the lexer read on into
    the pieces of one lexeme, and every object whose brace is a lexeme of its own was refused (JSONSchemaStore's
    monika config: 21 of its 22 notification kinds). The bounds are lowered so that this small union compiles
    as the large one did."""
    from radixlang.runtime.constrained.compiler import ConstraintCompiler
    from radixlang.runtime.constrained.jsonschema import json_schema as json_schema_module

    monkeypatch.setattr(json_schema_module, "JSON_REGEX_MAX_SIZE", 3000)
    monkeypatch.setattr(json_schema_module, "JSON_RULE_SIZE", 300)
    text_fields = {"type": "array", "items": {"type": "string"}}
    schema = {"anyOf": [
        _notification("desktop", None),
        _notification("pager", {"type": "array", "items": {
            "type": "object", "required": ["key", "probe"], "additionalProperties": False,
            "properties": {"key": {"type": "string"}, "probe": {"type": "string"}}}}),
        _notification("smtp", {"type": "object", "required": ["to", "host", "port"], "additionalProperties": True,
                               "properties": {"to": text_fields, "host": {"type": "string"}, "port": {"type": "integer"},
                                              "user": {"type": "string"}, "password": {"type": "string"}}}),
        _notification("chat", {"type": "object", "required": ["to", "url", "user", "password"],
                               "additionalProperties": False,
                               "properties": {"to": text_fields, "url": {"type": "string", "pattern": "^https?://"},
                                              "user": {"type": "string"}, "password": {"type": "string"}}})]}
    valid = ['{"id":"d1","type":"desktop"}',
             '{"id":"p1","type":"pager","data":[{"key":"k","probe":"p"}]}',
             '{"id":"s1","type":"smtp","data":{"to":["a@b.c"],"host":"h","port":25}}',
             '{"id":"c1","type":"chat","data":{"to":["1"],"url":"https://x","user":"u","password":"p"}}']
    invalid = ['{"id":"d1","type":"pager"}', '{"id":"c1","type":"desktop","data":{"to":[]}}']
    validator = jsonschema.Draft202012Validator(schema)
    constraint = ConstraintCompiler(lambda: compiler.vocab).compile("json_schema", schema)
    assert type(constraint).__name__ == "GrammarConstraint", "the lowered bounds make it a grammar of pieces"
    for text in valid + invalid:
        assert accepts(constraint, text) == validator.is_valid(json.loads(text)), text


def _node(width: int) -> dict:
    """A recursive definition (a rule) with `width` bounded strings: a large rule."""
    return {"type": "object", "properties": {**{f"f{i}": {"type": "string", "maxLength": 40} for i in range(width)},
                                             "kids": {"type": "array", "items": {"$ref": f"#/$defs/n{width}"}}}}


def written(grammar) -> str:
    """A grammar's root, rules and reports as text, its compiled automata in full (nodes holding them compare by
    identity)."""
    with np.printoptions(threshold=sys.maxsize):
        return repr((grammar.root, grammar.rules, grammar.unenforced))


def test_the_first_pass_stops_once_a_rule_decides_the_grammar_and_builds_the_same_one(monkeypatch):
    """The pass that decides between one regex and a grammar stops at the first recursive rule larger than one
    regex may be (any rule, in the rules form): the rest of it changes neither the choice nor how the grammar is
    built, so the grammar is the one the whole pass gives (the stop turned off), and that pass was cut short."""
    from radixlang.runtime.constrained.jsonschema import json_schema as json_schema_module

    large = {"type": "object", "properties": {f"m{w}": {"$ref": f"#/$defs/n{w}"} for w in (4, 1, 2, 3)},
             "$defs": {f"n{w}": _node(w) for w in (1, 2, 3, 4)}}
    # small rules, none larger than one regex may be: the first pass runs to its end (its object is a piece of its own
    # only where the grammar is not small)
    small = {"type": "object", "properties": {"t": {"$ref": "#/$defs/n1"}, "s": {"type": "string", "maxLength": 100}},
             "$defs": {"n1": _node(1)}}
    compiled: list[str] = []
    real = json_schema_module._SchemaCompiler.compile
    monkeypatch.setattr(json_schema_module._SchemaCompiler, "compile",
                        lambda self, s, path: compiled.append(path) or real(self, s, path))
    for schema, rules_form, limit in ((large, False, 3000), (large, True, None), (small, False, None)):
        if limit is not None:  # a small rule counts as large
            monkeypatch.setattr(json_schema_module, "JSON_REGEX_MAX_SIZE", limit)
        compiled.clear()
        cut = compile_json_schema(schema, rules_form=rules_form)
        cut_calls = len(compiled)
        with monkeypatch.context() as m:
            m.setattr(json_schema_module._SchemaCompiler, "_stop_if_grammar", lambda self: None)
            compiled.clear()
            whole = compile_json_schema(schema, rules_form=rules_form)
        assert whole.rules and written(cut) == written(whole)
        assert (cut_calls < len(compiled)) == (schema is large), "the first pass stopped early where it could"
        monkeypatch.undo()
        monkeypatch.setattr(json_schema_module._SchemaCompiler, "compile",
                            lambda self, s, path: compiled.append(path) or real(self, s, path))


def test_any_order_only_stops_at_the_first_object_kept_in_declared_order():
    """`any_order`: where the schema would keep an object in declared order (a large one with minProperties, which
    no checked object reads), the compile raises KeepsOrder, the caller's cue to take another way; elsewhere it
    returns the grammar it returns without the flag."""
    from radixlang.runtime.constrained.jsonschema.contract import KeepsOrder

    large = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(ANY_ORDER_MAX_PROPERTIES + 2)}}
    kept = {"type": "object", "properties": {"a": {**large, "minProperties": 1}, "b": large}}
    assert any(r.startswith("property order at #/properties/a") for r in compile_json_schema(kept, rules_form=True).unenforced)
    with pytest.raises(KeepsOrder, match="property order at #/properties/a"):
        compile_json_schema(kept, rules_form=True, any_order=True)
    taken = {"type": "object", "properties": {"a": large, "b": large}}
    plain, only = compile_json_schema(taken, rules_form=True), compile_json_schema(taken, rules_form=True, any_order=True)
    assert not plain.unenforced and written(plain) == written(only)
