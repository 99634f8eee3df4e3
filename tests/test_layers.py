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


def test_the_package_does_not_import_its_test_fixtures():
    offenders = sorted(f"{path.relative_to(ROOT)}" for folder in ORDER for path in (ROOT / folder).rglob("*.py")
                       if any(n.startswith("radixlang.testing") for n in imported_modules(path)))
    assert not offenders, offenders


# ---- inside runtime/: the core data and the step's policy sit below the features ------------------
FEATURES = ("constrained", "multimodal", "speculative")  # runtime packages the core must not import
CORE = ["request.py", "batch.py", "draft_tree.py", "image_span.py", "emit.py", "scheduling/scheduler.py",
        "kv/kv_manager.py", "scheduling/schedule_policy.py", "kv/radix_cache.py", "kv/memory.py"]
# cycles not broken yet: each names the modules of one strongly connected component. The test fails
# when one of them is gone too, so the list only shrinks (issue 24 broke the last ones).
KNOWN_CYCLES: list[set[str]] = []


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(["radixlang", *(parts[:-1] if parts[-1] == "__init__" else parts)])


def package_files() -> dict[str, Path]:
    files = {module_name(p): p for folder in ORDER for p in (ROOT / folder).rglob("*.py")}
    return files | {"radixlang": ROOT / "__init__.py"}


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere (top level, in functions, under TYPE_CHECKING);
    `from pkg import name` counts as importing pkg.name when that is a module."""
    files = package_files()
    graph = {}
    for name, path in files.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                submodules = {f"{module}.{a.name}" for a in node.names} & files.keys()
                edges.update(submodules or {module})
        graph[name] = {e for e in edges if e in files and e != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def test_the_cycle_finder_finds_a_cycle_and_only_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [{"a", "b", "c"}]


@pytest.mark.parametrize("name", CORE)
def test_core_runtime_modules_import_no_feature_package(name):
    features = {n for n in imported_modules(ROOT / "runtime" / name) if n.split(".")[1:3] in
                [["runtime", f] for f in FEATURES]}
    assert not features, f"runtime/{name} imports {sorted(features)}"


ASSEMBLY = ["engine", "wiring", "execution.engine_core", "scheduler_thread", "validation"]  # runtime's top: builds on the rest


@pytest.mark.parametrize("part", [*FEATURES, "core"])
def test_features_and_core_do_not_import_the_engine_assembly(part):
    """Upward imports inside runtime/: a feature package or a core module never reaches back up into
    the engine, its wiring, its step loop or the edge's validation (TYPE_CHECKING imports count)."""
    top = {f"radixlang.runtime.{m}" for m in ASSEMBLY}
    paths = [ROOT / "runtime" / name for name in CORE] if part == "core" else (ROOT / "runtime" / part).rglob("*.py")
    offenders = sorted(f"{path.relative_to(ROOT)} imports {name}" for path in paths
                       for name in imported_modules(path) if name in top)
    assert not offenders, offenders


def test_no_import_cycles_but_the_known_ones():
    found = [{m.removeprefix("radixlang.") for m in c} for c in cycles(import_graph())]
    new = [sorted(c) for c in found if c not in KNOWN_CYCLES]
    assert not new, f"import cycles: {new}"
    gone = [sorted(c) for c in KNOWN_CYCLES if c not in found]
    assert not gone, f"these cycles are broken: remove them from KNOWN_CYCLES: {gone}"
