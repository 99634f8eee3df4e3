"""Data flows server -> lang -> runtime -> kernels: no module imports a layer above its own."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]  # the repo root is the radixlang package
ORDER = ["kernels", "runtime", "lang", "server"]  # lowest first


def imported_modules(path: Path) -> set[str]:
    """Absolute names of the radixlang modules a file imports (relative imports resolved)."""
    package = ["radixlang", *path.relative_to(ROOT).parent.parts]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            names.add(".".join(base + ([node.module] if node.module else [])))
    return {n for n in names if n.startswith("radixlang")}


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ORDER else None


def test_the_import_resolver_sees_relative_and_absolute_imports():
    assert layer("radixlang.server.cli") == "server" and layer("radixlang") is None
    names = imported_modules(ROOT / "lang" / "gen_params.py")
    assert "radixlang.runtime.sampling_params" in names and "radixlang.lang.config" in names


@pytest.mark.parametrize("folder", ORDER)
def test_no_module_imports_a_layer_above_its_own(folder):
    above = set(ORDER[ORDER.index(folder) + 1:])
    offenders = {f"{path.relative_to(ROOT)} imports {name}"
                 for path in (ROOT / folder).rglob("*.py")
                 for name in imported_modules(path) if layer(name) in above}
    assert not offenders, sorted(offenders)
