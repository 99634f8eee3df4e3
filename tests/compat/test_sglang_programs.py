"""SGLang's own frontend test programs (`sglang/test/test_programs.py`, sglang wheel 0.5.23) against the
default model served by radixlang, both ways at once: the program file unchanged with `sglang` =
radixlang, and SGLang's own RuntimeEndpoint client (see sglang_programs.py, which runs them).

Every program must run. A program may fail only a check listed below: what a 135M model answers.
The server streams as SGLang's own CI runs its server for these programs (test/srt/test_srt_backend.py:
--incremental-streaming-output), which test_stream_logprobs needs.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from radixlang.server.launch import background_server

from .sglang_programs import ONLY_RADIXLANG, PROGRAMS

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(
    importlib.util.find_spec("sglang") is None or importlib.util.find_spec("msgspec") is None,
    reason="the sglang wheel (pip install --no-deps sglang, as `make install` does) or its frontend's imports "
           "(the test extra) are not installed")]

PROGRAMS_SCRIPT = Path(__file__).with_name("sglang_programs.py")
SUITE_TIMEOUT_S = 420

# content checks the 135M model may fail: program -> the exceptions its own checks raise
CONTENT_CHECKS = {
    "test_few_shot_qa": ("AssertionError",),  # capitals: "New York" for the United States
    "test_select": ("AssertionError",),  # True / False / Unknown judgements
    "test_decode_int": ("AssertionError",),  # 24 hours, 365 days
    "test_expert_answer": ("AssertionError",),  # mentions Paris
    "test_react": ("AssertionError",),  # Finland or the United States
    "test_parallel_encoding": ("AssertionError",),  # "Noah" from three statements
    # the model's JSON: REGEX_STR ([\w\d\s]*) lets a string hold a newline, which json.loads refuses
    "test_decode_json": ("JSONDecodeError", "AssertionError"),
    "test_decode_json_regex": ("JSONDecodeError", "AssertionError"),
    "test_dtype_gen": ("ValueError",),  # int("") / float(...) of what the model wrote
    # 64 sampled tokens, decoded and encoded again, may be 63: the model's random text re-tokenizes shorter
    "test_gen_min_new_tokens": ("AssertionError",),
}


def run_clients(url: str) -> dict[str, dict[str, dict]]:
    """Both clients at once (the engine batches their requests); each program's outcome per client."""
    # the script by its path, not `-m tests.compat...` from the repo root: the root on sys.path makes our kernels/
    # shadow the `kernels` distribution that transformers >= 5.25 imports
    procs = {client: subprocess.Popen([sys.executable, str(PROGRAMS_SCRIPT), client, url],
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for client in ("radixlang", "sglang")}
    deadline = time.monotonic() + SUITE_TIMEOUT_S
    outcomes = {}
    for client, proc in procs.items():
        try:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        outcomes[client] = {o["program"]: o for o in lines}
    return outcomes


def allowed(program: str, outcome: dict) -> bool:
    if outcome["result"] == "pass":
        return True
    if outcome["result"] != "fail":  # a hang
        return False
    return outcome["exception"] in CONTENT_CHECKS.get(program, ())


def test_every_sglang_program_runs_both_ways(smollm_engine):
    with background_server(smollm_engine, incremental_streaming_output=True) as server:
        outcomes = run_clients(server.url)
    for client, ran in outcomes.items():  # shown with -s, or when the test fails
        print(client, {name: (o["result"], o["seconds"]) for name, o in ran.items()})
    for client, expected in (("radixlang", PROGRAMS + ONLY_RADIXLANG), ("sglang", PROGRAMS)):
        ran = outcomes[client]
        assert sorted(ran) == sorted(expected), f"{client}: programs without a result: {set(expected) - set(ran)}"
        bad = {name: o for name, o in ran.items() if not allowed(name, o)}
        assert not bad, f"{client}: {json.dumps(bad, indent=1)}"
    # the programs that check no model content pass both ways
    for client, ran in outcomes.items():
        assert all(o["result"] == "pass" for name, o in ran.items() if name not in CONTENT_CHECKS), client
    smollm_engine.check_invariants()
