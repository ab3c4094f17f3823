# Two commands: `make run` starts the bot on the local web chat; `make test` runs every check.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CONFIG ?= config/ops.toml

.PHONY: run test lint typecheck imports pytest bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

# The bench extra too: the benchmark smoke tests run the LangGraph anchors (no test is skipped).
$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	touch $@ $(VENV)/.installed

run: $(VENV)/.installed
	$(BIN)/python -m bots run --config $(CONFIG) --adapter devchat

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(VENV)/.installed-dev
	$(BIN)/mypy
	$(BIN)/mypy -p bots

imports: $(VENV)/.installed-dev
	$(BIN)/lint-imports

# Two pytest processes (pytest-xdist), one per core: most tests wait on processes, sockets and timers.
TEST_PROCESSES ?= 2
pytest: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q -n $(TEST_PROCESSES) --dist worksteal $(PYTEST_ARGS)

test: lint typecheck imports pytest

bench: | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	$(BIN)/python -m benchmarks $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
