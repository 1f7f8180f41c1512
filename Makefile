# The two commands of the README: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install run test lint bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

## run: a coordinator and one local runner on SQLite (.corral/corral.db)
run: install
	$(BIN)/corral up

## lint: ruff (lint + format check) and mypy --strict
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

## test: everything CI runs (needs PostgreSQL, see CORRAL_TEST_PG)
test: lint
	$(BIN)/pytest -n 3 --dist loadfile --durations=40

## bench: dispatch latency and throughput on SQLite and PostgreSQL
bench: install
	$(BIN)/python benchmarks/dispatch.py

clean:
	rm -rf $(VENV) .corral .pytest_cache .mypy_cache .ruff_cache
