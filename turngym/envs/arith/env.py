"""``arith``: the model must evaluate a nested integer expression, one operation at a time.

A small but real multi-turn tool env: the calculator is the only way to compute, the
expression needs ``depth`` operations, and the reward is paid on the ``answer`` turn.
Used as the foundation's example env and in rollout tests with tiny models.
"""

from __future__ import annotations

import hashlib
import operator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from turngym.core.env import Env, Task
from turngym.core.types import Message, ToolResult
from turngym.tools import ToolError, tool

_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


@dataclass
class _Node:
    op: str | None = None
    left: _Node | None = None
    right: _Node | None = None
    value: int = 0

    def text(self) -> str:
        if self.op is None:
            return str(self.value)
        return f"({self.left.text()} {self.op} {self.right.text()})"  # type: ignore[union-attr]

    def eval(self) -> int:
        if self.op is None:
            return self.value
        return _OPS[self.op](self.left.eval(), self.right.eval())  # type: ignore[union-attr]


def _random_expr(rng: np.random.Generator, ops: int) -> _Node:
    if ops == 0:
        return _Node(value=int(rng.integers(2, 50)))
    left_ops = int(rng.integers(0, ops))
    return _Node(
        op=str(rng.choice(list(_OPS))),
        left=_random_expr(rng, left_ops),
        right=_random_expr(rng, ops - 1 - left_ops),
    )


def _next_step(node: _Node) -> tuple[int, str, int] | None:
    """The leftmost innermost operation whose operands are both numbers."""
    if node.op is None:
        return None
    assert node.left is not None and node.right is not None
    if node.left.op is None and node.right.op is None:
        return node.left.value, node.op, node.right.value
    return _next_step(node.left) or _next_step(node.right)


def _collapse(node: _Node, a: int, op: str, b: int) -> bool:
    """Replace the first operation ``a op b`` with its value; True if one was replaced."""
    if node.op is None:
        return False
    assert node.left is not None and node.right is not None
    if (
        node.left.op is None
        and node.right.op is None
        and (node.left.value, node.op, node.right.value) == (a, op, b)
    ):
        node.value, node.op, node.left, node.right = _OPS[op](a, b), None, None, None
        return True
    return _collapse(node.left, a, op, b) or _collapse(node.right, a, op, b)


class ArithEnv(Env):
    """Evaluate ``expression``; tools ``calculate(a, op, b)`` and ``answer(value)``."""

    default_max_turns = 8
    forkable = True  # all state is small and per-episode: a deep copy is an independent env

    def __init__(self, depth: int = 3, **kwargs: Any):
        if depth < 1:
            raise ValueError("depth must be >= 1")
        self.depth = depth
        super().__init__(**kwargs)
        self._expr: _Node | None = None
        self._work: _Node | None = None
        self._target = 0
        self._answer: int | None = None
        self._computed: set[int] = set()

    @tool
    def calculate(self, a: int, op: Literal["+", "-", "*"], b: int) -> str:
        """Compute one arithmetic operation on two integers.

        Args:
            a: left operand
            op: the operator
            b: right operand
        """
        value = _OPS[op](a, b)
        if abs(value) > 10**12:
            raise ToolError("result too large")
        self._computed.add(value)
        if self._work is not None:
            _collapse(self._work, a, op, b)
        return str(value)

    @tool(terminal=True)
    def answer(self, value: int) -> str:
        """Give the final value of the expression; ends the episode.

        Args:
            value: the value of the whole expression
        """
        self._answer = value
        return "answer recorded"

    def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> Task:
        depth = int(options.get("depth", self.depth))
        self._expr = _random_expr(rng, depth)
        self._work = _copy(self._expr)
        self._target = self._expr.eval()
        self._answer = None
        self._computed = set()
        expr = self._expr.text()
        system = (
            "You are a careful calculator agent. Evaluate the expression one operation at a time "
            "with the calculate tool, then give the final value with answer.\n" + self.tool_instructions()
        )
        return Task(
            messages=[
                Message(role="system", content=system.strip()),
                Message(role="user", content=f"Evaluate: {expr}"),
            ],
            task_id=f"arith-d{depth}-{_digest(expr)}",
            reference={"answer": self._target, "expression": expr},
        )

    def _turn_reward(self, results: list[ToolResult], done: bool) -> dict[str, float]:
        if not done:
            return {}
        if self._answer is None:
            return {"correct": 0.0, "format": -0.1}
        return {"correct": float(self._answer == self._target)}

    def _state_key(self) -> str:
        return f"{_digest(self._expr.text() if self._expr else '')}:{sorted(self._computed)}"

    def expert_action(self) -> str | None:
        if self._work is None:
            return None
        step = _next_step(self._work)
        if step is None:
            return self.format_call("answer", {"value": self._work.value})
        a, op, b = step
        return self.format_call("calculate", {"a": a, "op": op, "b": b})


def _copy(node: _Node) -> _Node:
    if node.op is None:
        return _Node(value=node.value)
    return _Node(op=node.op, left=_copy(node.left), right=_copy(node.right))  # type: ignore[arg-type]


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:10]
