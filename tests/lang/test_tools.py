"""Tools in programs: functions / pydantic models / schemas become tools; gen(tools=...) yields parsed
calls valid for their schemas (jsonschema, the oracle), locally and server-side (remote=True)."""
from __future__ import annotations

import json

import pytest

import radixlang as rl
from radixlang.lang.ir_json import ProgramIR

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is the oracle for the arguments")
pydantic = pytest.importorskip("pydantic")


def get_weather(city: str, days: int = 1) -> dict:
    """Forecast for a city.

    More detail that stays in the description."""
    return {"city": city, "days": days, "sky": "clear"}


def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


class Note(pydantic.BaseModel):
    """A note to remember."""
    text: str
    tags: list[str] = []


TOOLS = [get_weather, add]


@pytest.fixture
def endpoint(engine, server_url) -> rl.Endpoint:
    return rl.Endpoint(server_url)
SCHEMAS = {t.name: t.parameters for t in map(rl.tool, TOOLS)}


def test_functions_models_and_dicts_become_tools_with_schemas():
    weather = rl.tool(get_weather)
    assert weather.name == "get_weather" and weather.description.startswith("Forecast for a city.")
    assert weather.parameters == {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string"}, "days": {"type": "integer", "default": 1}}}
    note = rl.tool(Note)
    assert note.name == "Note" and note.description == "A note to remember." and note.parameters["required"] == ["text"]
    jsonschema.validate({"text": "x", "tags": ["a"]}, note.parameters)
    spec = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    assert rl.tool(spec).name == "f"
    with pytest.raises(ValueError, match="distinct names"):
        rl.gen("c", tools=[add, add])
    with pytest.raises(ValueError, match="tool_choice"):
        rl.gen("c", tools=[add], tool_choice="sub")
    with pytest.raises(ValueError, match="type 'object'"):
        rl.tool({"name": "g", "parameters": {"type": "array"}})


@rl.function
def agent_turn(s, question):
    s += rl.system(rl.tools_prompt(TOOLS))
    s += rl.user(question)
    s += rl.assistant(rl.gen("call", tools=TOOLS, tool_choice="required", max_tokens=80, temperature=0))


def test_gen_with_tools_returns_calls_valid_for_their_schemas_and_results_join_the_chat(backend):
    state = agent_turn.run(question="Weather in Oslo?", backend=backend)
    calls = state["call"]
    assert calls and all(set(c) == {"name", "arguments"} for c in calls)
    for c in calls:
        jsonschema.validate(c["arguments"], SCHEMAS[c["name"]])
    assert '<tool_call>{"name": "' in state.text()
    results = rl.tool_results(calls[:1], TOOLS)
    expected = json.dumps(get_weather(**calls[0]["arguments"])) if calls[0]["name"] == "get_weather" else \
        str(add(**calls[0]["arguments"]))
    assert results == f"<tool_response>\n{expected}\n</tool_response>"


def test_a_named_tool_choice_calls_that_tool(backend):
    @rl.function
    def named(s):
        s += rl.user("Add 2 and 3.")
        s += rl.assistant(rl.gen("call", tools=TOOLS, tool_choice="add", parallel_tool_calls=False, max_tokens=200,
                                          temperature=0))

    calls = named.run(backend=backend)["call"]
    assert [c["name"] for c in calls] == ["add"]
    jsonschema.validate(calls[0]["arguments"], SCHEMAS["add"])


def test_the_ir_carries_the_tools_and_a_remote_run_returns_the_same_calls(backend, endpoint):
    ir = ProgramIR.from_json(agent_turn.trace().to_json())
    assert "structural_tag" in ir.to_json() and "get_weather" in ir.to_json()
    local = agent_turn.run(question="Weather in Oslo?", backend=backend)
    remote = agent_turn.run(question="Weather in Oslo?", backend=endpoint, remote=True)
    assert remote.error() is None
    assert remote["call"] == local["call"] and remote.text() == local.text()


@rl.function
def cut_short(s):
    s += rl.user("Weather in Oslo?")
    s += rl.assistant(rl.gen("call", tools=TOOLS, tool_choice="required", max_tokens=6, temperature=0))


def test_a_call_cut_off_by_max_tokens_is_an_error_locally_and_remote(backend, endpoint):
    """Six tokens cannot hold a call: the state reports it (the variable is never a silent [])."""
    for state in (cut_short.run(backend=backend), cut_short.run(backend=endpoint, remote=True)):
        error = state.error()
        assert isinstance(error, Exception) and "max_tokens cut it off" in str(error)
    with pytest.raises(ValueError, match="no calls"):
        rl.tool_results([], TOOLS)


def test_calls_before_a_cut_off_one_are_kept_and_the_meta_says_so(backend):
    """The random model never ends its call list: at max_tokens the complete calls stay, flagged in the meta."""
    state = agent_turn.run(question="Weather in Oslo?", backend=backend)
    assert state["call"] and state.get_meta_info("call")["tool_call_cut_off"] is True
