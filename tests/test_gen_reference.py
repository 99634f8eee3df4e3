"""docs/gen_reference.py: the generated reference pages hold every option, route and sampling field the code
declares, each with its description, and come out the same on every run."""
from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from radixlang.runtime.config import EngineConfig
from radixlang.runtime.sampling_params import SamplingParams
from radixlang.server.limits import ServerLimits

SCRIPT = Path(__file__).resolve().parents[1] / "docs" / "gen_reference.py"


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("gen_reference", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pages(gen, tmp_path_factory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("reference")
    assert gen.main([str(out)]) == 0
    return {p.name: p.read_text() for p in out.iterdir()}


def _row(page: str, name: str) -> str:
    return next(line for line in page.splitlines() if line.startswith(f"| `{name}` |"))


def test_options_page_has_every_field_with_its_description_default_and_choices(pages):
    page = pages["options.md"]
    for cls in (EngineConfig, ServerLimits):
        for f in dataclasses.fields(cls):
            row = _row(page, f.name)
            assert f.metadata["help"].replace("|", "\\|") in row, f.name
            for choice in f.metadata["choices"]:
                assert f"`{choice}`" in row
    assert "`--tp-size --tp`" in _row(page, "tp_size")  # SGLang's spelling listed beside ours
    assert "`--log-requests`" in page and "`--host`" in page and "`--router-policy`" in page


def test_routes_page_lists_every_route_of_the_app_and_its_request_fields(gen, pages):
    page = pages["routes.md"]
    spec = gen.openapi_schema()
    for path, methods in spec["paths"].items():
        for method in methods:
            assert f"## `{method.upper()} {path}`" in page
    generate = page.split("### GenerateRequest", 1)[1].split("###", 1)[0]
    for field in ("text", "input_ids", "sampling_params", "stream"):
        assert f"| `{field}` |" in generate


def test_sampling_page_has_every_field_its_range_and_description(pages):
    page = pages["sampling.md"]
    for f in dataclasses.fields(SamplingParams):
        assert f.metadata["help"] in _row(page, f.name)
    assert "0 < value <= 1" in _row(page, "top_p")  # top_p's open lower bound
    assert "the model's context length" in _row(page, "max_new_tokens")


def test_cli_page_has_each_command(pages):
    page = pages["cli.md"]
    for command in ("generate", "serve", "quantize", "cache", "cache ls", "cache clear"):
        assert f"## `radixlang {command}`" in page


def test_the_pages_are_deterministic(gen, pages, tmp_path):
    assert gen.main([str(tmp_path)]) == 0
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == pages
