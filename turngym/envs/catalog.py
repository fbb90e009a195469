"""The built-in environments. Entry points are strings: nothing heavy is imported here.

One line per env id; each family adds its own.
"""

from turngym.core.registry import register

register(
    "arith-v0",
    "turngym.envs.arith.env:ArithEnv",
    family="arith",
    description="Evaluate a nested arithmetic expression with a calculator tool (the minimal example env).",
)
