"""separate_reasoning (SGLang's): the split against SGLang's own reasoning parser, a program against SGLang's own
frontend interpreter on the same canned model output, and the op through the IR to a server."""
from __future__ import annotations

import re
from typing import Any, Iterator

import pytest

import radixlang as rl
from radixlang.lang.backend import GenDelta
from radixlang.lang.chat import ChatTemplate
from radixlang.lang.reasoning import REASONING_FORMATS, reasoning_format

TEXTS = ["plain answer", "<think>plan</think>answer", "plan</think>answer", "<think><think>a</think>b</think>c",
         "<think>cut short", "\n<think>x</think>y", "<think>look<tool_call>{}</tool_call>",
         "<think>x<|tool_calls_section_begin|>y", "◁think▷k◁/think▷v", "[THINK]m[/THINK]n", "", "</think>"]


@pytest.mark.parametrize("model_type", sorted(REASONING_FORMATS))
def test_split_is_sglangs_reasoning_parser(model_type):
    parser = pytest.importorskip("sglang.srt.parser.reasoning_parser", reason="SGLang's parser is the oracle")
    for text in TEXTS:
        theirs = parser.ReasoningParser(model_type).parse_non_stream(text)
        assert reasoning_format(model_type).split(text) == theirs, text


def test_model_type_is_checked_when_the_program_is_written():
    with pytest.raises(ValueError, match="needs a model_type"):
        rl.separate_reasoning(rl.gen("a"))
    with pytest.raises(ValueError, match="unsupported reasoning model_type 'gpt-7'"):
        rl.separate_reasoning(rl.gen("a"), model_type="gpt-7")
    with pytest.raises(ValueError, match="gen / select named"):
        rl.separate_reasoning(rl.gen(), model_type="qwen3")


CANNED = ["think hard</think>The answer", "no think", "<think>plan</think>Final"]


class CannedBackend:
    """radixlang's side of the comparison: answers each gen with the next canned text."""

    def __init__(self, outputs: list[str]):
        self.outputs = list(outputs)

    def generate(self, state: Any, gen: Any) -> Iterator[GenDelta]:
        yield GenDelta(self.outputs.pop(0), meta={})

    def select(self, state: Any, choices: list[str], method: Any) -> tuple[int, dict]:
        return 0, {}

    def cache_prefix(self, text: str) -> None:
        pass

    def chat_template(self) -> ChatTemplate:  # SGLang's "default" template: ROLE:content\n
        return ChatTemplate(lambda messages, _: "".join(f"{m['role'].upper()}:{m['content']}\n" for m in messages))

    def flush_cache(self) -> bool:
        return True

    def get_server_info(self) -> dict[str, Any]:
        return {}


def conversation(sgl: Any) -> Any:
    @sgl.function
    def chat(s):
        s += sgl.user("Q?")
        s += sgl.assistant(sgl.separate_reasoning(sgl.gen("first"), model_type="deepseek-r1"))
        s += sgl.user("again")
        s += sgl.assistant(sgl.separate_reasoning(sgl.gen("second"), model_type="qwen3"))
        s += sgl.user("more")
        s += sgl.assistant(sgl.separate_reasoning(sgl.gen("third"), model_type="QWEN3"))
    return chat


def sglang_run(outputs: list[str]) -> Any:
    pytest.importorskip("sglang.lang.interpreter", reason="SGLang's frontend is the oracle")
    import sglang
    from sglang.lang.backend.base_backend import BaseBackend
    from sglang.lang.chat_template import get_chat_template

    class Canned(BaseBackend):
        def __init__(self):
            super().__init__()
            self.chat_template = get_chat_template("default")

        def get_chat_template(self):
            return self.chat_template

        def generate(self, s, sampling_params):
            return outputs.pop(0), {}

    state = conversation(sglang).run(backend=Canned())
    # SGLang's executor thread sets a gen's variable before its separate_reasoning rewrites it: wait for the
    # whole program, or a read may race the rewrite (it did, on a busy machine)
    state.sync()
    return state


@pytest.mark.parametrize("traced", [False, True])
def test_program_matches_sglangs_interpreter(traced):
    theirs = sglang_run(list(CANNED))
    chat = conversation(rl)
    ours = chat.run(backend=CannedBackend(CANNED)) if not traced else rl.interpret(
        rl.ProgramIR.from_json(chat.trace().to_json()), backend=CannedBackend(CANNED))
    names = ["first", "second", "third"]
    for name in names + [f"{n}_reasoning_content" for n in names]:
        assert ours[name] == theirs[name], name
    assert (ours["first_reasoning_content"], ours["second_reasoning_content"]) == ("think hard", "")
    assert ours.messages() == theirs.messages()  # the history each next turn's prompt is built from
    assert ours.text() == theirs.text()


def test_each_variable_of_an_expression_loses_its_own_reasoning():
    """SGLang's interpreter fails on several variables (KeyError on the first's reasoning event); radixlang
    cuts each variable's reasoning where it sits, keeping the text between them."""
    @rl.function
    def two(s):
        s += rl.user("Q")
        s += rl.assistant(rl.separate_reasoning(rl.gen("a") + "!" + rl.gen("b"), model_type="qwen3"))

    state = two.run(backend=CannedBackend(["<think>plan</think>Final", "<think>more</think>B"]))
    assert (state["a"], state["a_reasoning_content"], state["b"], state["b_reasoning_content"]) == \
        ("Final", "plan", "B", "more")
    assert state.messages()[1]["content"] == "Final!B" and state.text() == "USER:Q\nASSISTANT:Final!B\n"


def test_ir_version_is_the_oldest_that_holds_the_program():
    @rl.function
    def plain(s):
        s += rl.gen("a")

    @rl.function
    def thinking(s):
        s += rl.separate_reasoning(rl.gen("a"), model_type="qwen3")

    assert plain.trace().to_dict()["version"] == 1
    assert thinking.trace().to_dict()["version"] == rl.IR_VERSION == 2


THINK = r"<think>[a-z]{1,4}</think>[a-z]{1,4}"


@rl.function
def forced_thought(s):
    s += "Q:" + rl.separate_reasoning(rl.gen("a", max_tokens=16, regex=THINK), model_type="qwen3")
    s += "\nreasoned: " + s["a_reasoning_content"]


def test_remote_run_matches_the_local_run(backend, server_url):
    local = forced_thought.run(backend=backend, temperature=0)
    remote = forced_thought.run(backend=rl.Endpoint(server_url), remote=True, temperature=0)
    reasoning, answer = local["a_reasoning_content"], local["a"]
    assert re.fullmatch(THINK, f"<think>{reasoning}</think>{answer}")
    assert local.text() == f"Q:{answer}\nreasoned: {reasoning}"
    assert (remote["a"], remote["a_reasoning_content"], remote.text()) == (answer, reasoning, local.text())
