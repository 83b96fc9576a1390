# Quick start: `make run` (environment + install + the main job) and `make test` (the whole suite).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: run test install install-test lint typecheck bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

run: install
	$(BIN)/hpcpipe run quickstart

lint: install-test
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy

test: install-test lint
	$(BIN)/pytest -q

bench: install
	$(BIN)/python benchmarks/trainer_overhead.py

clean:
	rm -rf $(VENV) runs data .pytest_cache .mypy_cache .ruff_cache
