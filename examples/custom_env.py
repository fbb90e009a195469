"""Writing an environment: a guessing game with one tool and a terminal tool.

    python examples/custom_env.py            # registers the env, checks it, plays the expert

The pattern every family follows: ``@tool`` methods (typed arguments + docstring = schema),
``_reset`` returns a ``Task``, ``_turn_reward`` returns reward components, ``expert_action``
gives a scripted expert for tests and demos.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import turngym
from turngym import Env, Message, Task, ToolError, tool
from turngym.testing import check_env


class GuessNumberEnv(Env):
    """Find a secret integer in [lo, hi] by asking whether it is above a value."""

    default_max_turns = 12

    def __init__(self, hi: int = 100, **kwargs: Any):
        self.hi = hi
        super().__init__(**kwargs)
        self.secret = 0
        self.lo_known, self.hi_known = 1, hi
        self.guess: int | None = None

    @tool
    def is_above(self, value: int) -> str:
        """Ask whether the secret is strictly above a value.

        Args:
            value: the value to compare with
        """
        if not 1 <= value <= self.hi:
            raise ToolError(f"value must be in [1, {self.hi}]")
        above = self.secret > value
        if above:
            self.lo_known = max(self.lo_known, value + 1)
        else:
            self.hi_known = min(self.hi_known, value)
        return "yes" if above else "no"

    @tool(terminal=True)
    def guess_number(self, value: int) -> str:
        """Make the final guess; ends the episode.

        Args:
            value: your guess
        """
        self.guess = value
        return "guess recorded"

    def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> Task:
        self.secret = int(rng.integers(1, self.hi + 1))
        self.lo_known, self.hi_known, self.guess = 1, self.hi, None
        system = "Find the secret number with as few questions as possible.\n" + self.tool_instructions()
        return Task(
            messages=[
                Message(role="system", content=system),
                Message(role="user", content=f"The secret is an integer between 1 and {self.hi}."),
            ],
            task_id=f"guess-{self.hi}-{self.secret}",
            reference={"answer": self.secret},
        )

    def _turn_reward(self, results: list[Any], done: bool) -> dict[str, float]:
        if not done:
            return {}
        return {"correct": float(self.guess == self.secret)}

    def _state_key(self) -> str:
        return f"{self.lo_known}-{self.hi_known}"  # same interval = same state (for GiGPO grouping)

    def expert_action(self) -> str:
        if self.lo_known == self.hi_known:
            return f'<tool_call>{{"name": "guess_number", "arguments": {{"value": {self.lo_known}}}}}</tool_call>'
        mid = (self.lo_known + self.hi_known) // 2
        return f'<tool_call>{{"name": "is_above", "arguments": {{"value": {mid}}}}}</tool_call>'


if __name__ == "__main__":
    turngym.register("guess-number-v0", GuessNumberEnv, hi=100, description="binary search game")
    check_env("guess-number").raise_for_failures()
    env = turngym.make("guess-number")
    obs, info = env.reset(seed=0)
    done, total = False, 0.0
    while not done:
        obs, reward, terminated, truncated, info = env.step(env.expert_action())
        total += reward
        done = terminated or truncated
    print(f"solved {info['task_id']} in {info['turn']} turns, return {total}")
