# ZeroBatch developer commands. `make demo` and `make test` work on a fresh clone: each creates
# the virtual environment in .venv (override with VENV=...) and installs the package into it.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.zerobatch-installed

.PHONY: help venv install demo test lint typecheck vectors check-vectors conformance clean

help:
	@echo "make demo   - set up, write a demo dataset and iterate it"
	@echo "make test   - set up, lint, type-check, check vectors, run conformance and all tests"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]' --config-settings editable_mode=strict
	touch $(STAMP)

venv: $(STAMP)

# Strict editable installs link each package file; relink so new modules are picked up.
install: $(STAMP)
	$(PY) -m pip install --quiet --no-deps -e . --config-settings editable_mode=strict

demo: install
	$(PY) -m zerobatch_core demo

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy -p zerobatch_core -p zerobatch_spec -p zerobatch_conformance

vectors: install
	$(PY) -m zerobatch_conformance.generate conformance/vectors

check-vectors: install
	$(PY) -m zerobatch_conformance.generate --check conformance/vectors

conformance: install
	$(PY) -m zerobatch_core conformance --vectors conformance/vectors

test: lint typecheck check-vectors conformance
	$(PY) -m pytest

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis demo-output
