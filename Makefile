# ZeroBatch developer commands. `make demo` and `make test` work on a fresh clone: each creates
# the virtual environment in .venv (override with VENV=...) and installs what it needs into it.
# PyTorch is pinned to the CPU build this machine class ships (never an unpinned `torch`).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet
TORCH_PIN ?= torch==2.13.0
BASE := $(VENV)/.zerobatch-base
FRAMEWORKS := $(VENV)/.zerobatch-frameworks
EDITABLE := --config-settings editable_mode=strict

# CI simulates 8 JAX devices on the CPU and treats a skipped adapter test as a failure.
TEST_ENV := XLA_FLAGS=--xla_force_host_platform_device_count=8 ZEROBATCH_REQUIRE_FRAMEWORKS=1 \
	TF_CPP_MIN_LOG_LEVEL=2

.PHONY: help install demo bench test lint typecheck vectors check-vectors conformance pytest clean \
	mutation

help:
	@echo "make demo   - set up (core + PyTorch), write a dataset from the bundled corpus, train"
	@echo "make test   - set up (core + PyTorch, JAX, TensorFlow), lint, type-check, vectors,"
	@echo "              conformance and every test"
	@echo "make mutation - mutation testing of spec/ and the core (order, loader, reader, writer,"
	@echo "              validation, datasets, slicing, remote reads, stores, live datasets,"
	@echo "              retention, provenance; slow, resumable, not part of make test):"
	@echo "              MUTATION_ARGS='spec/layout.py --jobs 2' picks modules and parallelism"

# Core, dev tools and the pinned PyTorch (installed first so nothing pulls another build).
$(BASE): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) "$(TORCH_PIN)"
	$(PIP) -e '.[dev,torch]' $(EDITABLE)
	touch $@

# JAX, TensorFlow and torchdata for the adapter tests.
$(FRAMEWORKS): $(BASE)
	$(PIP) -e '.[ci]' $(EDITABLE)
	touch $@

# Strict editable installs link each package file; relink so new modules are picked up.
install: $(BASE)
	$(PIP) --no-deps -e . $(EDITABLE)

# The training demo lives in examples/, outside the packages: core + PyTorch is all it needs.
demo: install
	$(PY) examples/train_demo.py

# Benchmarks against peers and the machine's limits (peers: bash benchmarks/peers_env.sh);
# results on this class of machine: benchmarks/RESULTS.md.
bench: install $(FRAMEWORKS)
	$(PIP) -e '.[bench]' $(EDITABLE)
	$(PY) benchmarks/loader_bench.py
	$(PY) benchmarks/writer_bench.py
	$(PY) benchmarks/shuffle_quality.py

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install $(FRAMEWORKS)
	$(VENV)/bin/mypy -p zerobatch_core -p zerobatch_spec -p zerobatch_conformance \
		-p zerobatch_adapters

vectors: install
	$(PY) -m zerobatch_conformance.generate conformance/vectors

check-vectors: install
	$(PY) -m zerobatch_conformance.generate --check conformance/vectors

conformance: install
	$(PY) -m zerobatch_core conformance --vectors conformance/vectors

# PyTorch's DataLoader workers fork; forking after JAX or TensorFlow started threads can
# deadlock, so the PyTorch adapter tests run in a pytest process of their own.
TORCH_TESTS := tests/adapters/test_torch.py tests/adapters/test_torchrun.py

pytest: install $(FRAMEWORKS)
	$(TEST_ENV) $(PY) -m pytest $(addprefix --ignore=,$(TORCH_TESTS))
	$(TEST_ENV) $(PY) -m pytest $(TORCH_TESTS)

test: lint typecheck check-vectors conformance pytest

# Mutation testing with Cosmic Ray (tests/README.md, "Mutation testing"): each module's mutants
# run in a private copy under build/mutation, so the working tree is never mutated. Slow (many
# hours for every module on two cores), resumable, and not part of `make test` or CI.
MUTATION_ARGS ?=
mutation: install
	$(PIP) -e '.[mutation]' $(EDITABLE)
	$(PY) tests/mutation/run.py $(MUTATION_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis demo-output
