"""A small env whose latency and faults are configurable, for engine tests and benchmarks."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from turngym.core.env import Task
from turngym.core.types import Message, ToolResult
from turngym.tools import tool
from turngym.tools.env import Env


class FaultyEnv(Env):
    """``ping`` until ``turns_needed`` pings were made, then ``done``. Faults by flag."""

    live = 0
    max_live = 0
    made = 0
    closed = 0

    def __init__(
        self,
        *,
        step_delay: float = 0.0,
        turns_needed: int = 2,
        fail_reset: bool = False,
        fail_step_at: int | None = None,
        fail_close: bool = False,
        hang_close: bool = False,
        **kwargs: Any,
    ):
        kwargs.setdefault("tool_timeout", None)  # let the engine's timeouts fire
        super().__init__(**kwargs)
        self.step_delay, self.turns_needed = step_delay, turns_needed
        self.fail_reset, self.fail_step_at = fail_reset, fail_step_at
        self.fail_close, self.hang_close = fail_close, hang_close
        self.pings = 0
        FaultyEnv.made += 1

    @classmethod
    def reset_counters(cls) -> None:
        cls.live = cls.max_live = cls.made = cls.closed = 0

    @tool
    async def ping(self) -> str:
        """Ping."""
        await asyncio.sleep(self.step_delay)
        self.pings += 1
        return "pong"

    @tool(terminal=True)
    def done(self) -> str:
        """Finish."""
        return "ok"

    def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> Task:
        if self.fail_reset:
            raise RuntimeError("reset exploded")
        FaultyEnv.live += 1
        FaultyEnv.max_live = max(FaultyEnv.max_live, FaultyEnv.live)
        self.pings = 0
        n = int(rng.integers(0, 1000))
        return Task(
            messages=[
                Message(role="system", content=self.tool_instructions()),
                Message(role="user", content=f"task {n}"),
            ],
            task_id=f"faulty-{n}",
            reference={"n": n},
        )

    def _turn_reward(self, results: list[ToolResult], done: bool) -> dict[str, float]:
        if self.fail_step_at is not None and self.turn >= self.fail_step_at:
            raise RuntimeError("reward service down")
        return {"done": 1.0} if done and self.terminated else {}

    async def _close(self) -> None:
        if self.task is not None:
            FaultyEnv.live -= 1
        FaultyEnv.closed += 1
        if self.hang_close:
            await asyncio.sleep(3600)
        if self.fail_close:
            raise RuntimeError("close exploded")

    def expert_action(self) -> str:
        name = "done" if self.pings >= self.turns_needed else "ping"
        return f'<tool_call>{{"name": "{name}", "arguments": {{}}}}</tool_call>'
