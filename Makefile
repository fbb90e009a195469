# The two commands of the README: `make demo` (the main job, end to end) and `make test`.
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo test lint format bench docs

setup:
	bash scripts/setup.sh

# The main job, end to end: watch the scripted expert on arith (a calculator tool; it double-checks its
# calculation on half the tasks), train a tiny model on CPU (an SFT warm start on such expert episodes,
# then 120 IGPO steps under a 2-turn budget that leaves no room for the double-check), printing held-out
# success before and after, greedy and of the policy's own samples (4 per task at T=1), then write the
# HTML report of the run with both eval curves. examples/configs/demo.yaml records what it shows on 3 seeds
# (sampled success rises during RL on each: 0.20 -> 0.46, 0.14 -> 0.30, 0.28 -> 0.71) and how long it took
# (~8.5 min on 2 shared cores). One torch thread: on a shared 2-core machine two threads made a step ~8x slower.
demo: setup
	$(BIN)/turngym play arith --expert --seed 5 -n 2 --env-arg depth=1 --env-arg tools_in_prompt=false \
		--env-arg max_turns=3 --env-arg expert_recheck=0.5
	OMP_NUM_THREADS=1 $(BIN)/turngym train examples/configs/demo.yaml
	$(BIN)/turngym view runs/demo

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: setup lint
	$(BIN)/python -m pytest -q -ra --durations=40

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
