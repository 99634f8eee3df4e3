"""The public API: SGLang's names exist at the package root, and importing it stays light."""
from __future__ import annotations

import subprocess
import sys

import radixlang as rl

SGLANG_NAMES = [
    "function", "gen", "gen_int", "gen_string", "select", "image", "system", "user", "assistant",
    "system_begin", "system_end", "user_begin", "user_end", "assistant_begin", "assistant_end",
    "set_default_backend", "flush_cache", "Runtime", "RuntimeEndpoint", "token_length_normalized",
    "greedy_token_selection", "unconditional_likelihood_normalized", "ChoicesDecision", "ChoicesSamplingMethod",
]


def test_sglang_frontend_names_are_exported():
    missing = [name for name in SGLANG_NAMES if not hasattr(rl, name)]
    assert missing == []
    assert rl.function is rl.program
    assert set(rl.__all__) >= set(SGLANG_NAMES) | {"program", "Endpoint", "ProgramIR", "interpret", "run_ir"}


def test_importing_radixlang_does_not_import_torch():
    code = "import sys, radixlang as rl; rl.gen('x'); rl.function(lambda s: None).trace(); " \
           "print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_engine_is_imported_on_first_use():
    from radixlang.runtime.engine import Engine

    assert rl.Engine is Engine


def test_program_decorator_forms():
    def body(s, x):
        s += x

    assert isinstance(rl.program(body), rl.Program)
    assert isinstance(rl.program()(body), rl.Program)
    assert rl.function(body).name == "body"
