"""arith: evaluate a nested arithmetic expression with a calculator tool (the minimal example family)."""
