"""Every option describes itself: each flag of `serve` and `generate` has a description, the engine's come from
EngineConfig's declarations (one source), fixed value sets are listed and checked, and mistakes print the
command's own usage or say what to do."""
from __future__ import annotations

import argparse
import dataclasses

import pytest

from radixlang.runtime.config import EngineConfig
from radixlang.server.cli import build_parser, field_flags, main
from radixlang.server.limits import ServerLimits


def _command(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]


@pytest.mark.parametrize("command", ["serve", "generate", "quantize"])
def test_every_option_of_a_command_has_a_description(command):
    parser = _command(command)
    missing = [a.dest for a in _options(parser) if not a.help or a.help.startswith("(default")]
    assert not missing, f"`radixlang {command}` options without a description: {missing}"
    # and the rendered --help shows them (argparse formats help with %: an unescaped one would raise here)
    assert "KV pool size in tokens" in parser.format_help() or command != "serve"


def test_engine_flags_are_described_by_their_field_declaration():
    serve = {a.option_strings[0]: a for a in _options(_command("serve")) if a.option_strings}
    for f in dataclasses.fields(EngineConfig):
        if f.name == "model":
            continue
        action = serve[field_flags(f)[0]]
        assert action.help.startswith(f.metadata["help"].replace("%", "%%")), f.name
        assert f.metadata["help"] and not f.metadata["help"].startswith("(")
    for f in dataclasses.fields(ServerLimits):
        assert serve[field_flags(f)[0]].help.startswith(f.metadata["help"])


def test_fixed_value_sets_are_listed_and_checked_by_the_parser(capsys):
    serve = {a.dest: a for a in _options(_command("serve"))}
    for name in ("schedule_policy", "preemption_mode", "quantization", "attention_backend",
                 "speculative_algorithm", "dtype", "compile_layers"):
        assert serve[name].choices, name
    assert list(serve["schedule_policy"].choices) == ["least-prefill", "lpm", "fcfs", "dfs-weight"]
    # every listed value is one the engine accepts (the listing is not a second, drifting copy)
    for value in serve["quantization"].choices:
        EngineConfig(quantization=value, device="cpu").validate()
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["serve", "--quantization", "int3"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: radixlang serve") and "invalid choice: 'int3'" in err


@pytest.mark.parametrize("command", ["serve", "generate"])
def test_an_unknown_flag_prints_the_commands_usage_not_the_top_level_one(command, capsys):
    argv = [command, "--no-such-flag"] if command == "serve" else [command, "hi", "--no-such-flag"]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: radixlang {command} ")
    assert f"radixlang {command}: error: unrecognized arguments: --no-such-flag" in err


@pytest.mark.parametrize("command", ["serve", "generate", "quantize"])
def test_a_hub_id_says_it_needs_a_local_download_first(command, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no folder of that name here
    hub_id = "HuggingFaceTB/SmolLM2-135M-Instruct"
    argv = {"serve": ["serve", "--model", hub_id], "generate": ["generate", "--model", hub_id, "hi"],
            "quantize": ["quantize", hub_id, str(tmp_path / "out")]}[command]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "looks like a Hugging Face hub id" in err
    assert "huggingface-cli download HuggingFaceTB/SmolLM2-135M-Instruct --local-dir SmolLM2-135M-Instruct" in err
    assert "--model SmolLM2-135M-Instruct" in err


def test_a_missing_local_path_is_not_called_a_hub_id(capsys, tmp_path):
    assert main(["serve", "--model", str(tmp_path / "model.gguf")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "hub id" not in err


def test_log_requests_reaches_fleet_workers():
    from radixlang.server.fleet import worker_flags

    assert build_parser().parse_args(["serve"]).log_requests is False
    flags = list(worker_flags({"log_requests": True, "compile_layers": "true"}))
    worker = build_parser().parse_args(["serve", *flags])
    assert worker.log_requests is True and worker.compile_layers == "true"
