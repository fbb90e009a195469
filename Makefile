# The two commands of the README: `make demo` (the main job, end to end) and `make test`.
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo test lint format bench docs

setup:
	bash scripts/setup.sh

# The main job, end to end: watch the scripted expert on arith (a calculator tool), train a tiny
# model on it on CPU (SFT warm start on expert episodes, then 60 IGPO steps; examples/configs/demo.yaml
# says what it shows and how long it takes), printing held-out success before and after, then write
# the HTML report of the run.
demo: setup
	$(BIN)/turngym play arith --expert -n 2 --env-arg depth=1 --env-arg tools_in_prompt=false
	$(BIN)/turngym train examples/configs/demo.yaml
	$(BIN)/turngym view runs/demo

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
