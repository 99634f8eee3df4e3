"""SGLang's frontend behaviours its own test programs rely on (issue 25), on the tiny engine in process and
through the server: per-chunk stream meta, variables set on finished states, the program's own error,
global_config, num_api_spec_tokens, the REGEX_* names."""
from __future__ import annotations

import ast
import asyncio
import importlib.metadata
import importlib.util
import re
from pathlib import Path

import pytest

import radixlang as rl


@rl.function
def answer(s):
    s += "Q: Say something.\nA:" + rl.gen("answer", max_tokens=12, return_logprob=True)


def chunks_with_meta(state) -> list[tuple[str, dict]]:
    async def collect():
        return [pair async for pair in state.text_async_iter("answer", return_meta_data=True)]
    return asyncio.run(collect())


@pytest.mark.parametrize("via", ["engine", "server", "incremental server"])
def test_text_async_iter_yields_each_chunks_own_meta_as_sglang(backend, request, via):
    """SGLang's test_stream_logprobs checks, plus: the chunks' logprobs add up to the variable's; through a
    server that streams all so far (SGLang's default) or only what is new (its incremental_streaming_output)."""
    urls = {"server": "server_url", "incremental server": "incremental_server_url"}
    chosen = backend if via == "engine" else rl.Endpoint(request.getfixturevalue(urls[via]))
    for _ in range(3):  # text_async_iter, like SGLang's, joins what arrived while the reader was away: a busy
        # machine may let all 12 steps land before the first read; a stream that never splits fails all three
        state = answer.run(backend=chosen, stream=True, temperature=0, ignore_eos=True)
        chunks = chunks_with_meta(state)
        if len(chunks) > 1:
            break
    assert len(chunks) > 1
    done = seen = 0
    for text, meta in chunks:
        assert text
        assert meta["completion_tokens"] == meta["output_token_logprobs_length"]
        assert len(meta["output_token_logprobs"]) == meta["completion_tokens"] - done
        done = meta["completion_tokens"]
        seen += len(meta["output_token_logprobs"])
    final = state.get_meta_info("answer")
    assert seen == done == final["completion_tokens"] == 12
    assert [lp for _, m in chunks for lp in m["output_token_logprobs"]] == final["output_token_logprobs"]
    assert "".join(text for text, _ in chunks) == state["answer"]


def test_a_finished_state_takes_new_variable_values(backend):
    @rl.function
    def number(s):
        s += "Number: " + rl.gen("n", dtype=int, max_tokens=6)

    state = number.run(backend=backend, temperature=0)
    text = state["n"]
    state["n"] = int(text)  # SGLang's test_dtype_gen
    state["extra"] = [1, 2]
    assert state["n"] == int(text) and state["extra"] == [1, 2]
    assert state.text().endswith(text)  # the text keeps what was generated


def test_a_read_after_the_program_failed_raises_the_programs_own_error(backend):
    @rl.function
    def broken(s):
        s += "Q:" + rl.gen("a", max_tokens=2)
        s += rl.gen("b", 4, None, 1, "x", "not ids")  # stop_token_ids, positionally as in SGLang: a ValueError

    state = broken.run(backend=backend)
    with pytest.raises(ValueError, match="stop_token_ids") as raised:
        state["b"]
    assert state.error() is raised.value
    with pytest.raises(ValueError, match="stop_token_ids"):  # "a" may have been cancelled by the failure
        state.sync()


def test_global_config_is_sglangs_and_refuses_unknown_settings(backend, capsys):
    try:
        rl.global_config.default_backend = backend
        assert rl.global_config.default_backend is backend
        rl.global_config.verbosity = 2
        answer.run(temperature=0)
        assert "Q: Say something." in capsys.readouterr().out
    finally:
        rl.global_config.verbosity = 0
    with pytest.raises(AttributeError, match="no setting 'enable_everything'"):
        rl.global_config.enable_everything = True
    with pytest.raises(TypeError, match="boolean"):
        rl.global_config.enable_parallel_encoding = "yes"


def test_num_api_spec_tokens_is_accepted_and_refused_with_stream(backend):
    @rl.function(num_api_spec_tokens=64)
    def spec(s):
        s += "Name:" + rl.gen("name", stop="\n", max_tokens=6)

    assert spec.num_api_spec_tokens == 64
    assert spec.run(backend=backend, temperature=0)["name"] is not None
    with pytest.raises(ValueError, match="stream=True cannot be used with num_api_spec_tokens"):
        spec.run(backend=backend, stream=True)
    with pytest.raises(ValueError, match="num_api_spec_tokens must be an integer >= 1"):
        rl.function(num_api_spec_tokens=0)(lambda s: None)


def test_run_takes_sglangs_n_of_one(backend):
    assert answer.run(backend=backend, n=1, temperature=0, max_new_tokens=2)["answer"] is not None
    with pytest.raises(ValueError, match="must be 1"):
        answer.run(backend=backend, n=2)


def test_sglangs_regex_names_import_from_lang_ir():
    from radixlang.lang.ir import REGEX_BOOL, REGEX_FLOAT, REGEX_INT, REGEX_STR

    assert re.fullmatch(REGEX_INT, "-42 \n") and re.fullmatch(REGEX_FLOAT, ".5") and re.fullmatch(REGEX_FLOAT, "6e2")
    assert re.fullmatch(REGEX_BOOL, "False") and re.fullmatch(REGEX_STR, '"Paris 2"')


def test_every_name_sglang_exports_exists_and_hosted_backends_say_what_to_use():
    """sglang/__init__.py's __all__ and sglang/lang/api.py's functions, read from the installed wheel."""
    spec = importlib.util.find_spec("sglang")
    if spec is None:
        pytest.skip("the sglang wheel is not installed")
    package = Path(spec.origin).parent
    exported = next(ast.literal_eval(node.value) for node in ast.parse((package / "__init__.py").read_text()).body
                    if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets))
    api = [node.name for node in ast.parse((package / "lang" / "api.py").read_text()).body
           if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")]
    assert "separate_reasoning" in api and "OpenAI" in exported
    assert [name for name in [*exported, *api] if not hasattr(rl, name)] == []
    assert rl.__version__ == importlib.metadata.version("radixlang")
    for backend_class in (rl.OpenAI, rl.Anthropic, rl.LiteLLM, rl.VertexAI, rl.Crusoe):
        with pytest.raises(NotImplementedError, match="RuntimeEndpoint"):
            backend_class("gpt-4o", api_key="x")
    with pytest.raises(NotImplementedError, match="rl.Engine"):
        rl.ServerArgs(model_path="m")


def test_stop_regex_and_logprob_start_len_reach_the_engine(backend, engine):
    full = engine.generate("Q: Count.\nA:", {"temperature": 0, "max_new_tokens": 12}).text
    pattern = re.escape(full[3:5])

    @rl.function
    def counted(s):
        s += "Q: Count.\nA:" + rl.gen("a", max_tokens=12, stop_regex=pattern, return_logprob=True,
                                      logprob_start_len=2)

    state = counted.run(backend=backend, temperature=0)
    assert state["a"] == full[:re.search(pattern, full).start()]
    meta = state.get_meta_info("a")
    prompt_tokens = len(engine.tokenizer.encode("Q: Count.\nA:"))
    assert len(meta["input_token_logprobs"]) == prompt_tokens - 2
