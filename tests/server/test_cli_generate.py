"""`radixlang generate` end to end in a subprocess, on the tiny model folder."""
from __future__ import annotations

import subprocess
import sys


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "radixlang.server.cli", *args],
                          capture_output=True, text=True, timeout=300)


def test_generate_prints_the_greedy_completion(tiny_model_dir, tiny_engine_factory):
    expected = tiny_engine_factory().generate("Hello world", {"temperature": 0, "max_new_tokens": 5}).text
    res = run_cli("generate", "Hello world", "--max-tokens", "5", "--model", str(tiny_model_dir))
    assert res.returncode == 0, res.stderr
    assert res.stdout == expected + "\n"


def test_generate_with_chat_template(tiny_model_dir, tiny_engine_factory):
    engine = tiny_engine_factory()
    prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
    expected = engine.generate(prompt, {"temperature": 0, "max_new_tokens": 4}).text
    res = run_cli("generate", "Hi", "--chat", "--max-tokens", "4", "--model", str(tiny_model_dir))
    assert res.stdout == expected + "\n"


def test_bad_arguments_exit_with_a_clear_error(tiny_model_dir):
    res = run_cli("generate", "Hi", "--max-tokens", "-3", "--model", str(tiny_model_dir))
    assert res.returncode == 2 and "max_new_tokens" in res.stderr
    res = run_cli("generate", "Hi", "--model", "/nonexistent/model.gguf")
    assert res.returncode == 2 and "does not exist" in res.stderr


def test_the_generate_path_imports_no_server_no_transformers_and_no_compiler():
    # what `radixlang generate` imports: the CLI module, then the engine (fastapi alone took 0.25-0.6 s;
    # jinja2, 0.12 s, comes with the first chat template)
    heavy = ("fastapi", "starlette", "uvicorn", "pydantic", "transformers", "torch._dynamo", "torch._inductor",
             "jinja2")
    code = ("import sys, radixlang.server.cli, radixlang.runtime.engine; "
            f"print(sorted(m for m in sys.modules if m.startswith({heavy!r})))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"
