"""The docs without a model or MkDocs: the README's length, mkdocs.yml's nav against the pages on disk,
page lengths, and each page's tested python blocks against tests/doc_snippets.py's table (`make docs`
builds the site itself with --strict; tests/e2e/test_doc_snippets.py runs the blocks)."""
from __future__ import annotations

import importlib.util

import yaml

from tests.doc_snippets import ROOT, RUNNABLE, doc_pages, python_blocks


def nav_pages(nav: list) -> list[str]:
    pages = []
    for entry in nav:
        for value in (entry.values() if isinstance(entry, dict) else [entry]):
            pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_readme_is_at_most_300_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300


def test_every_nav_page_exists_and_no_page_is_over_1000_lines(tmp_path):
    """The written pages in docs/, the generated references as docs/gen_reference.py writes them (`make docs`
    writes them into docs/reference/ before mkdocs builds; here into a temporary folder)."""
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "docs" / "gen_reference.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.main([str(tmp_path)]) == 0
    generated = {f"reference/{name}": tmp_path / name for name in gen.PAGES}
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    pages = nav_pages(config["nav"])
    assert len(pages) >= 8 and len(set(pages)) == len(pages)
    paths = {p: generated.get(p, ROOT / "docs" / p) for p in pages}
    missing = [p for p, path in paths.items() if not path.is_file()]
    assert not missing, f"mkdocs.yml's nav names pages that do not exist: {missing}"
    long = {p: n for p, path in paths.items() if (n := len(path.read_text().splitlines())) > 1000}
    assert not long, f"pages over 1,000 lines (split them): {long}"


def test_each_page_runs_the_python_blocks_the_table_says():
    counts = {page: sum(b.tested for b in python_blocks(page)) for page in doc_pages()}
    for page, expected in RUNNABLE.items():
        assert counts[page] == expected, (
            f"{page} has {counts[page]} tested python blocks, tests/doc_snippets.py expects {expected}")
    untested = {page: n for page, n in counts.items() if n and page not in RUNNABLE}
    assert not untested, (f"python blocks the suite would not run: {untested}; list the page in "
                          "tests/doc_snippets.py's RUNNABLE (and its outputs in tests/e2e/test_doc_snippets.py) "
                          "or mark each block `<!-- not tested: why -->`")


def test_a_marked_block_is_skipped_and_the_others_run(tmp_path, monkeypatch):
    import tests.doc_snippets as snippets

    (tmp_path / "page.md").write_text("```python\na = 1\n```\n\n<!-- not tested: needs a GPU -->\n"
                                      "```python\nb = 2\n```\n<!-- a comment -->\n```python\nc = 3\n```\n"
                                      "```bash\nls\n```\n")
    monkeypatch.setattr(snippets, "ROOT", tmp_path)
    blocks = snippets.python_blocks("page.md")
    assert [(b.code, b.tested, b.line) for b in blocks] == [("a = 1\n", True, 1), ("b = 2\n", False, 6),
                                                            ("c = 3\n", True, 10)]
