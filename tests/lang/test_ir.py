"""The IR: JSON round-trips, validation of untrusted input, and what tracing records."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import radixlang as rl
from radixlang.lang.images import load_image
from radixlang.lang.ir import (
    Arg,
    Fork,
    Gen,
    GenParams,
    Image,
    Join,
    RoleBegin,
    RoleEnd,
    Select,
    SetVar,
    Text,
    Var,
    VarScopeBegin,
    VarScopeEnd,
)
from radixlang.lang.ir_json import Op, ProgramIR

names = st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6)
gen_params = st.builds(
    GenParams,
    max_tokens=st.none() | st.integers(0, 64),
    stop=st.none() | st.lists(st.text(min_size=1, max_size=3), min_size=1, max_size=2),
    temperature=st.none() | st.floats(0, 2),
    top_p=st.none() | st.floats(0.01, 1),
    top_k=st.none() | st.integers(-1, 50),
    ignore_eos=st.none() | st.booleans(),
    return_logprob=st.none() | st.booleans(),
    top_logprobs_num=st.none() | st.integers(0, 5),
    dtype=st.none() | st.sampled_from(["int", "float", "bool", "str"]),
)


@st.composite
def ir_programs(draw) -> ProgramIR:
    """Valid IR programs: random ops on live states, with forks, joins and references."""
    params = draw(st.lists(names, max_size=3, unique=True))
    ops: list[Op] = []
    live, known, next_id = [0], [0], 1
    open_forks: list[tuple[int, list[int]]] = []
    for _ in range(draw(st.integers(0, 14))):
        state = draw(st.sampled_from(live))
        kind = draw(st.sampled_from(["text", "arg", "var", "gen", "select", "role", "image", "scope", "set",
                                     "fork", "join"]))
        if kind == "text":
            node = Text(draw(st.text(max_size=12)))
        elif kind == "arg" and params:
            node = Arg(draw(st.sampled_from(params)))
        elif kind == "var":
            node = Var(draw(names), draw(st.sampled_from(known)))
        elif kind == "gen":
            node = Gen(draw(st.none() | names), draw(gen_params))
        elif kind == "select":
            choices = draw(st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=4))
            source = Arg(params[0]) if params and draw(st.booleans()) else choices
            node = Select(draw(st.none() | names), source, draw(st.sampled_from(rl.lang.ir.CHOICE_METHODS)))
        elif kind == "role":
            role = draw(st.sampled_from(["system", "user", "assistant"]))
            node = draw(st.sampled_from([RoleBegin(role), RoleEnd(role)]))
        elif kind == "image":
            node = Image(load_image(draw(st.binary(min_size=1, max_size=16))))
        elif kind == "scope":
            node = draw(st.sampled_from([VarScopeBegin, VarScopeEnd]))(draw(names))
        elif kind == "set":
            node = SetVar(draw(names), draw(json_values))
        elif kind == "fork":
            children = list(range(next_id, next_id + draw(st.integers(1, 3))))
            next_id += len(children)
            node = Fork(len(children), children)
            live += children
            known += children
            open_forks.append((state, children))
        elif kind == "join" and any(p == state for p, _ in open_forks):
            parent, children = next(f for f in open_forks if f[0] == state)
            open_forks.remove((parent, children))
            node = Join(children, draw(st.sampled_from(rl.lang.ir.JOIN_MODES)))
            live = [s for s in live if s not in children]
        else:
            continue
        ops.append(Op(state, node))
    return ProgramIR(draw(names), params, ops)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ir_programs())
def test_every_valid_ir_program_round_trips_through_json(program):
    program.validate()
    text = program.to_json()
    assert ProgramIR.from_json(text) == program
    assert ProgramIR.from_json(ProgramIR.from_json(text).to_json()).to_json() == text


def _ir(ops, params=()):
    return {"version": 1, "name": "p", "params": list(params), "ops": ops}


@pytest.mark.parametrize("doc, message", [
    ({"version": 3, "name": "p", "params": [], "ops": []}, "unsupported IR version 3"),
    ({"version": True, "name": "p", "params": [], "ops": []}, "unsupported IR version True"),
    (_ir([{"state": 0, "op": "separate_reasoning", "names": ["a"], "model_type": "qwen3"}]),
     "ops[0]: op 'separate_reasoning' is not in IR version 1"),
    (_ir([{"state": 0, "op": "separate_reasoning", "names": ["a"], "model_type": "gpt-7"}]) | {"version": 2},
     "ops[0] (separate_reasoning): unsupported reasoning model_type 'gpt-7'"),
    (_ir([{"state": 0, "op": "separate_reasoning", "names": [""], "model_type": "qwen3"}]) | {"version": 2},
     "names must be non-empty strings"),
    (_ir([{"state": 0, "op": "teleport"}]), "ops[0].op must be one of"),
    (_ir([{"state": 0, "op": "text"}]), "needs field 'value'"),
    (_ir([{"state": 0, "op": "text", "value": 3}]), "ops[0].value must be a str"),
    (_ir([{"state": 0, "op": "text", "value": "x", "color": 1}]), "unknown field(s) ['color']"),
    (_ir([{"state": 1, "op": "text", "value": "x"}]), "state 1 does not exist"),
    (_ir([{"state": 0, "op": "arg", "name": "q"}]), "argument 'q' is not in params"),
    (_ir([{"state": 0, "op": "gen", "name": "a", "params": {"temperature": -1}}]), "temperature must be in"),
    (_ir([{"state": 0, "op": "gen", "name": "a", "params": {"max_tokens": "many"}}]),
     "ops[0].params.max_tokens must be an integer"),
    (_ir([{"state": 0, "op": "gen", "name": "a", "params": {"top_q": 1}}]), "unknown gen field(s) ['top_q']"),
    (_ir([{"state": 0, "op": "select", "name": "a", "choices": []}]), "choices must be a non-empty list"),
    (_ir([{"state": 0, "op": "select", "name": "a", "choices": ["x"], "method": "vibes"}]), "choice method"),
    (_ir([{"state": 0, "op": "role_begin", "role": "narrator"}]), "role must be one of"),
    (_ir([{"state": 0, "op": "fork", "size": 2, "children": [1]}]), "match the children"),
    (_ir([{"state": 0, "op": "fork", "size": 1, "children": [0]}]), "new, distinct state ids"),
    (_ir([{"state": 0, "op": "join", "children": [1]}]), "not one fork of state 0"),
    (_ir([{"state": 0, "op": "fork", "size": 1, "children": [1]}, {"state": 0, "op": "join", "children": [1]},
          {"state": 1, "op": "text", "value": "late"}]), "already joined"),
    (_ir([{"state": 0, "op": "image", "source": {"kind": "encoded", "data": "aGk=", "hash": "00",
                                                 "mode": None, "size": None}}]), "hash does not match"),
    ({"version": 1, "name": "p", "params": ["a", "a"], "ops": []}, "distinct identifiers"),
])
def test_from_json_rejects_invalid_programs_naming_the_problem(doc, message):
    with pytest.raises(ValueError) as e:
        ProgramIR.from_json(json.dumps(doc))
    assert message in str(e.value)


def test_from_json_rejects_malformed_json():
    with pytest.raises(ValueError, match="not valid JSON"):
        ProgramIR.from_json("{")


# ---- tracing ----------------------------------------------------------------------------------------
@rl.function
def qa(s, question, style="short"):
    s += rl.system("Answer in a " + style + " way.")
    s += rl.user(f"Question: {question}?")
    with s.assistant():
        s += "Answer:" + rl.gen("answer", max_tokens=8, stop="\n")
    s += f"\nYou said {s['answer']}."


def test_trace_records_text_arguments_roles_and_variable_references():
    ir = qa.trace()
    assert ir.params == ["question"]
    assert [op.node for op in ir.ops] == [
        RoleBegin("system"), Text("Answer in a short way."), RoleEnd("system"),
        RoleBegin("user"), Text("Question: "), Arg("question"), Text("?"), RoleEnd("user"),
        RoleBegin("assistant"), Text("Answer:"), Gen("answer", GenParams(max_tokens=8, stop=["\n"])),
        RoleEnd("assistant"), Text("\nYou said "), Var("answer", 0), Text("."),
    ]
    assert all(op.state == 0 for op in ir.ops)


def test_trace_fixes_given_arguments_into_the_ir():
    ir = qa.trace(question="Why", style="long")
    assert ir.params == []
    texts = "".join(op.node.value for op in ir.ops if isinstance(op.node, Text))
    assert "Question: Why?" in texts and "a long way" in texts


@rl.function
def branches(s, topic):
    s += "Topic: " + topic + "\n"
    forks = s.fork(2)
    forks += lambda i: f"Idea {i}:" + rl.gen("idea", max_tokens=4)
    forks[1] += forks[0]["idea"]
    forks.join()
    s += rl.select("pick", ["a", "b"])
    with s.copy() as c:
        c += rl.gen("extra", max_tokens=2)


def test_trace_records_forks_joins_and_cross_state_references():
    ir = branches.trace()
    assert [(op.state, type(op.node).__name__) for op in ir.ops] == [
        (0, "Text"), (0, "Arg"), (0, "Text"), (0, "Fork"), (1, "Text"), (1, "Gen"), (2, "Text"), (2, "Gen"),
        (2, "Var"), (0, "Join"), (0, "Select"), (0, "Fork"), (3, "Gen"), (0, "Join")]
    assert ir.ops[3].node == Fork(2, [1, 2])
    assert ir.ops[8].node == Var("idea", 1)
    assert ir.ops[9].node == Join([1, 2], "gather_variable")
    assert ProgramIR.from_json(ir.to_json()) == ir


@pytest.mark.parametrize("body, message", [
    (lambda s, q: s.__iadd__("yes" if s["x"] == "y" else "no"), "a comparison needs generated variable 'x'"),
    (lambda s, q: s.__iadd__("long" if len(s["x"]) > 3 else "short"), "len() needs generated variable 'x'"),
    (lambda s, q: s.__iadd__(str(int(s["x"]) + 1)), "int() needs generated variable 'x'"),
    (lambda s, q: s.__iadd__("!" if s["x"] else "?"), "a truth test"),
    (lambda s, q: s.__iadd__(s["x"].strip()), ".strip needs generated variable 'x'"),
    (lambda s, q: s.__iadd__(q.upper()), ".upper needs argument 'q'"),
    (lambda s, q: s.__iadd__(str(q).upper()), "a string operation changed a traced value"),
    (lambda s, q: s.__iadd__(str(q)[:3]), "a string operation changed a traced value"),
    (lambda s, q: s.__iadd__(str(q).replace("L", "l")), "a string operation changed a traced value"),
    (lambda s, q: s.__iadd__(f"{q:>9}"), "the format spec"),
    (lambda s, q: s.__iadd__(s.text()), "the state's text is unknown while tracing"),
    (lambda s, q: s.__iadd__(rl.gen("y", max_tokens=s["x"])), "gen's max_tokens depends on generated variable"),
    (lambda s, q: s.__iadd__(rl.gen("y", stop=f"{q}")), "a parameter of gen depends on a value unknown"),
    (lambda s, q: s.__iadd__(rl.select("y", choices=s["x"])), "select's choices needs generated variable 'x'"),
    (lambda s, q: [s.__iadd__(c) for c in q], "iteration needs argument 'q'"),
    (lambda s, q: s.__iadd__(rl.select("y", ["a"], choices_method=lambda **kw: None)), "custom choice method"),
])
def test_tracing_control_flow_on_unknown_values_raises_a_clear_error(body, message):
    @rl.function
    def prog(s, q):
        s += "Q: " + q + "\nA:" + rl.gen("x", max_tokens=2)
        body(s, q)

    with pytest.raises(rl.TraceError) as e:
        prog.trace()
    assert message in str(e.value)


def test_program_with_generated_control_flow_still_runs_eagerly(backend):
    @rl.function
    def branchy(s):
        s += "Pick a letter:" + rl.gen("x", max_tokens=2, temperature=0)
        s += " long" if len(s["x"]) > 3 else " short"
        s += rl.gen("y", max_tokens=2, temperature=0)

    with pytest.raises(rl.TraceError):
        branchy.trace()
    state = branchy.run(backend=backend)
    assert state.error() is None
    expected = " long" if len(state["x"]) > 3 else " short"
    assert state.text() == "Pick a letter:" + state["x"] + expected + state["y"]


def test_trace_rejects_unknown_arguments_and_undefined_variables():
    with pytest.raises(TypeError, match="no argument"):
        qa.trace(nonsense=1)

    @rl.function
    def reads_missing(s):
        s += s["never"]

    with pytest.raises(KeyError, match="never"):
        reads_missing.trace()


def test_images_enter_the_ir_by_content_hash_and_as_arguments(tmp_path):
    path = tmp_path / "cat.png"
    path.write_bytes(b"\x89PNG fake bytes")

    @rl.function
    def look(s, other):
        s += rl.image(str(path)) + "and" + rl.image(other)

    ir = look.trace()
    first = ir.ops[0].node.source
    assert first.hash == load_image(path.read_bytes()).hash and first.data == path.read_bytes()
    assert ir.ops[2].node == Image(Arg("other"))
    assert ProgramIR.from_json(ir.to_json()) == ir
