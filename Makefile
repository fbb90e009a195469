# The two commands of the README: `make demo` (the main job, end to end) and `make test`.
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo test lint format bench docs

setup:
	bash scripts/setup.sh

# The main job on the default env (search-qa): watch the scripted expert, train a tiny model with
# IGPO on CPU (SFT warm start, 4 RL steps, ~2 minutes), then write the HTML report of the run.
demo: setup
	$(BIN)/turngym play search-qa --expert -n 2
	$(BIN)/turngym train examples/configs/igpo_search_qa.yaml
	$(BIN)/turngym view runs/igpo-search-qa

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: setup lint
	$(BIN)/python -m pytest -q -ra

format:
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# Every CPU benchmark (~7 min on 2 cores) -> docs/results.md with plots in docs/results/.
# Re-render the report and plots from the saved run without running anything:
#   $(BIN)/python benchmarks/run_all.py --reuse docs/results.md
bench: setup
	$(BIN)/python benchmarks/run_all.py

docs:
	$(BIN)/typer turngym.cli utils docs --name turngym --output docs/cli.md
