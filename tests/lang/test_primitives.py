"""Each primitive on the tiny model, checked against the engine called directly."""
from __future__ import annotations

import json

import pytest

import radixlang as rl

PROMPT = "The quick brown fox jumps over the lazy dog. Then"


def test_gen_appends_exactly_what_the_engine_generates(backend, oracle_engine):
    @rl.function
    def story(s):
        s += PROMPT
        s += rl.gen("rest", max_tokens=12, temperature=0)

    state = story.run(backend=backend)
    expected = oracle_engine.generate(PROMPT, {"max_new_tokens": 12, "temperature": 0})
    assert state["rest"] == expected.text
    assert state.text() == PROMPT + expected.text
    meta = state.get_meta_info("rest")
    assert meta["prompt_tokens"] == expected.meta.prompt_tokens
    assert meta["completion_tokens"] == expected.meta.completion_tokens
    assert meta["finish_reason"]["type"] == expected.meta.finish_reason


@pytest.mark.parametrize("gen_kwargs, sampling", [
    ({"max_tokens": 5}, {"max_new_tokens": 5}),
    ({"max_tokens": 20, "stop": [" the", "."]}, {"max_new_tokens": 20, "stop": [" the", "."]}),
    ({"max_tokens": 9, "frequency_penalty": 1.5, "presence_penalty": 0.5},
     {"max_new_tokens": 9, "frequency_penalty": 1.5, "presence_penalty": 0.5}),
    ({"max_tokens": 6, "min_tokens": 6, "ignore_eos": True}, {"max_new_tokens": 6, "min_new_tokens": 6,
                                                               "ignore_eos": True}),
    ({"max_tokens": 8, "top_k": 1, "temperature": 0.7}, {"max_new_tokens": 8, "top_k": 1, "temperature": 0.7}),
    ({"max_tokens": 8, "stop_token_ids": [13]}, {"max_new_tokens": 8, "stop_token_ids": [13]}),
])
def test_gen_passes_sampling_fields_to_the_engine(backend, oracle_engine, gen_kwargs, sampling):
    gen_kwargs.setdefault("temperature", 0)
    sampling.setdefault("temperature", 0)

    @rl.function
    def prog(s):
        s += PROMPT + rl.gen("out", **gen_kwargs)

    state = prog.run(backend=backend)
    assert state["out"] == oracle_engine.generate(PROMPT, sampling).text


def test_return_logprob_reports_the_engines_token_logprobs(backend, oracle_engine):
    @rl.function
    def prog(s):
        s += PROMPT + rl.gen("out", max_tokens=4, temperature=0, return_logprob=True, top_logprobs_num=3,
                             return_text_in_logprobs=True)

    state = prog.run(backend=backend)
    meta = state.get_meta_info("out")
    expected = oracle_engine.generate(PROMPT, {"max_new_tokens": 4, "temperature": 0}, return_logprob=True,
                                      top_logprobs_num=3)
    got = meta["output_token_logprobs"]
    assert [e[1] for e in got] == expected.output_ids
    assert [e[0] for e in got] == pytest.approx([lp.logprob for lp in expected.meta.output_logprobs], abs=1e-4)
    assert "".join(e[2] for e in got) == state["out"]
    assert [[t for _, t, _ in top] for top in meta["output_top_logprobs"]] == \
        [[t for t, _ in lp.top] for lp in expected.meta.output_logprobs]


def test_run_sampling_defaults_apply_unless_gen_overrides_them(backend, oracle_engine):
    @rl.function
    def prog(s):
        s += PROMPT + rl.gen("a") + rl.gen("b", max_tokens=2)

    state = prog.run(backend=backend, max_new_tokens=5, temperature=0)
    a = oracle_engine.generate(PROMPT, {"max_new_tokens": 5, "temperature": 0}).text
    b = oracle_engine.generate(PROMPT + a, {"max_new_tokens": 2, "temperature": 0}).text
    assert (state["a"], state["b"]) == (a, b)


def test_roles_render_with_the_models_chat_template(backend, engine):
    @rl.function
    def chat(s, question):
        s += rl.system("Be brief.")
        with s.user():
            s += question
        s += rl.assistant_begin() + rl.gen("answer", max_tokens=6, temperature=0) + rl.assistant_end()
        s.user("Thanks!")
        s += rl.assistant("You're welcome.")

    state = chat.run(question="Hi?", backend=backend)
    messages = state.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert messages[2]["content"] == state["answer"]
    assert state.text() == engine.tokenizer.apply_chat_template(messages, add_generation_prompt=False)
    assert state.text().startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n")


def test_assistant_gen_sees_the_generation_prompt_the_template_would_add(backend, engine, oracle_engine):
    @rl.function
    def chat(s):
        s += rl.user("Name a color.")
        s += rl.assistant(rl.gen("color", max_tokens=5, temperature=0))

    state = chat.run(backend=backend)
    prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": "Name a color."}])
    assert state["color"] == oracle_engine.generate(prompt, {"max_new_tokens": 5, "temperature": 0}).text


@pytest.mark.parametrize("body, message", [
    (lambda s: s.__iadd__(rl.user_begin() + rl.assistant_begin()), "roles do not nest"),
    (lambda s: s.__iadd__(rl.user_end()), "user_end has no matching user_begin"),
])
def test_misused_roles_fail_the_program_with_a_clear_error(backend, body, message):
    state = rl.function(body).run(backend=backend)
    assert isinstance(state.error(), ValueError) and message in str(state.error())
    with pytest.raises(ValueError, match=message):
        state.sync()


def test_var_scope_set_var_and_membership(backend):
    @rl.function
    def prog(s):
        with s.var_scope("greeting"):
            s += "Hello, " + "world" + rl.gen("more", max_tokens=3, temperature=0)
        s += "!" + s["greeting"]  # read inside the program: waits for the scope's gen
        s["count"] = 3
        s.set_var("tags", ["a", "b"])
        s += str(s["count"])

    state = prog.run(backend=backend)
    assert state["greeting"] == "Hello, world" + state["more"]
    assert state.text() == state["greeting"] + "!" + state["greeting"] + "3"
    assert (state["count"], state["tags"]) == (3, ["a", "b"])
    assert "greeting" in state and "missing" not in state
    with pytest.raises(KeyError, match="missing"):
        state["missing"]


class FakePILImage:
    """Quacks like PIL.Image.Image (PIL is not a dependency)."""

    mode, size = "RGB", (2, 1)

    def tobytes(self) -> bytes:
        return bytes([255, 0, 0, 0, 255, 0])


def test_images_are_recorded_by_hash_and_a_text_model_refuses_them(backend, tmp_path):
    path = tmp_path / "img.bin"
    path.write_bytes(b"encoded image bytes")

    @rl.function
    def look(s):
        s += "A:" + rl.image(str(path)) + " B:" + rl.image(b"other bytes") + " C:" + rl.image(FakePILImage())
        s += rl.gen("caption", max_tokens=3)

    state = look.run(backend=backend)
    error = state.error()
    assert isinstance(error, ValueError) and "does not support images" in str(error) and "sends 3" in str(error)
    with pytest.raises(ValueError, match="does not support images"):
        state["caption"]
    hashes = [img.hash for img in state._core.images]
    assert len(set(hashes)) == 3
    assert hashes[0] == rl.lang.images.load_image(b"encoded image bytes").hash
    assert state._core.images[2].kind == "pixels" and state._core.images[2].size == [2, 1]


def test_image_rejects_missing_files_and_other_types():
    with pytest.raises(ValueError, match="does not exist"):
        rl.image("/no/such/image.png")
    with pytest.raises(TypeError, match="file path, bytes or a PIL image"):
        rl.image(12)
    with pytest.raises(ValueError, match="empty"):
        rl.image(b"")


@pytest.mark.parametrize("kwargs, message", [
    ({"max_tokens": -1}, "max_tokens must be in [0, context_length], got -1"),
    ({"max_tokens": "ten"}, "max_tokens must be an integer"),
    ({"temperature": -0.5}, "temperature must be in [0.0"),
    ({"top_p": 0.0}, "top_p must be in (0, 1]"),
    ({"min_p": 2.0}, "min_p must be in [0.0, 1.0]"),
    ({"top_k": -3}, "top_k must be in [-1, vocab_size], got -3"),
    ({"frequency_penalty": 5.0}, "frequency_penalty must be in [-2.0, 2.0]"),
    ({"stop": []}, "stop must be a non-empty"),
    ({"stop_token_ids": [-1]}, "stop_token_ids must be token ids in [0, vocab_size), got [-1]"),
    ({"ignore_eos": "yes"}, "ignore_eos must be a boolean"),
    ({"top_logprobs_num": -1}, "top_logprobs_num must be an integer >= 0"),
    ({"dtype": list}, "dtype must be one of"),
    ({"regex": "("}, "not a valid regular expression"),
    ({"json_schema": "{oops"}, "json_schema is not valid JSON"),
    ({"grammar": " "}, "grammar must be a non-empty"),
    ({"regex": "a+", "dtype": int}, "at most one of dtype, regex, json_schema and grammar"),
])
def test_gen_rejects_bad_fields_naming_them(kwargs, message):
    with pytest.raises(ValueError) as e:
        rl.gen("x", **kwargs)
    assert message in str(e.value)


def test_gen_and_select_reject_bad_names_and_choices():
    with pytest.raises(ValueError, match="variable name"):
        rl.gen(3)
    with pytest.raises(ValueError, match="non-empty list of strings"):
        rl.select("x", choices="ab")
    with pytest.raises(ValueError, match="every choice must be a non-empty string"):
        rl.select("x", choices=["a", ""])
    with pytest.raises(ValueError, match="temperature must be 0"):
        rl.select("x", choices=["a"], temperature=0.5)


def test_json_schema_accepts_a_dict_or_a_pydantic_model():
    pydantic = pytest.importorskip("pydantic")

    class Person(pydantic.BaseModel):
        name: str
        age: int

    from_model = rl.gen("p", json_schema=Person).params.json_schema
    assert json.loads(from_model) == Person.model_json_schema()
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert json.loads(rl.gen("p", json_schema=schema).params.json_schema) == schema


def test_gen_choices_is_a_select():
    node = rl.gen("pick", choices=["x", "y"], choices_method=rl.greedy_token_selection)
    assert isinstance(node, rl.lang.ir.Select) and node.method == "greedy_token_selection"


def test_errors_inside_a_program_surface_through_error_and_sync(backend):
    @rl.function
    def broken(s):
        s += "Start:" + rl.gen("a", max_tokens=2, temperature=0)
        s += 42  # not text

    state = broken.run(backend=backend)
    assert isinstance(state.error(), TypeError) and "cannot append int" in str(state.error())
    with pytest.raises(TypeError, match="cannot append int"):
        state.sync()
    with pytest.raises(TypeError):
        state.text()


def test_backend_errors_inside_a_program_surface_too(backend):
    @rl.function
    def nothing_to_condition_on(s):
        s += rl.gen("a", max_tokens=2)

    state = nothing_to_condition_on.run(backend=backend)
    with pytest.raises(ValueError, match="no text before it"):
        state.sync()


def test_run_checks_arguments_before_starting(backend, monkeypatch):
    @rl.function
    def prog(s, question):
        s += question

    with pytest.raises(TypeError):
        prog.run(backend=backend)
    with pytest.raises(TypeError):
        prog.run("a", "b", backend=backend)
    with pytest.raises(ValueError, match="unknown sampling default"):
        rl.lang.interpreter.sampling_defaults({"temprature": 0})
    monkeypatch.setattr(rl.lang.default_backend, "_default", None)
    with pytest.raises(ValueError, match="no backend"):
        prog.run("q")


def test_programs_compose_bind_and_return_values(backend):
    @rl.function
    def greet(s, name):
        s += "Hello, " + name + ". "

    @rl.function
    def outer(s, name):
        greet(s, name)
        s += "Bye."
        return "done"

    state = outer.bind(name="Ada").run(backend=backend)
    assert state.text() == "Hello, Ada. Bye."
    assert state.ret_value == "done"
    assert greet.run("Bob", backend=backend).text() == "Hello, Bob. "


def test_appending_after_the_program_returned_is_refused(backend):
    state = rl.function(lambda s: s.__iadd__("x")).run(backend=backend)
    with pytest.raises(RuntimeError, match="takes no more input"):
        state += "more"
