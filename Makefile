# The two commands of the README: `make demo` (the main job, end to end) and `make test`.
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo test lint format bench docs

setup:
	bash scripts/setup.sh

demo: setup
	$(BIN)/turngym play search-qa --expert -n 3

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: setup lint
	$(BIN)/python -m pytest -q -ra

format:
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: setup
	$(BIN)/python benchmarks/run_all.py

docs:
	$(BIN)/typer turngym.cli utils docs --name turngym --output docs/cli.md
