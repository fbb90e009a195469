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

from turngym.core.env import Task
from turngym.core.types import Message, ToolResult
from turngym.tools import ToolError, tool
from turngym.tools.env import Env

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

    # constructor and reset are microseconds of pure Python: no thread hop per episode
    construct_in_thread = False
    sync_hooks_in_thread = False

    default_max_turns = 8
    forkable = True  # all state is small and per-episode: a deep copy is an independent env

    def __init__(
        self,
        depth: int = 3,
        expert_recheck: float = 0.0,
        tool_reward: float = 0.0,
        **kwargs: Any,
    ):
        """``tool_reward``: a stepwise reward component ``tool_ok`` paid on every turn for each
        ``calculate`` call that ran, beside the outcome ``correct`` of the answer turn. It is a dense
        critic a policy can farm (calculate again instead of answering): the setting G-RA (credit
        ``gated``) is for. 0 (the default): no stepwise reward.

        ``expert_recheck``: the share of tasks on which the scripted expert repeats its last
        ``calculate`` call once before answering (a careful expert double-checking), so that a student's
        warm start puts a redundant call in its support, which a farmable ``tool_reward`` can then grow.
        Which tasks is fixed by the expression's hash, not drawn from the episode's RNG."""
        if depth < 1:
            raise ValueError("depth must be >= 1")
        if not 0.0 <= expert_recheck <= 1.0:
            raise ValueError(f"expert_recheck must be in [0, 1], got {expert_recheck}")
        self.depth = depth
        self.expert_recheck = expert_recheck
        self.tool_reward = float(tool_reward)
        super().__init__(**kwargs)
        self._expr: _Node | None = None
        self._work: _Node | None = None
        self._target = 0
        self._answer: int | None = None
        self._computed: set[int] = set()
        self._calls: list[tuple[int, str, int]] = []  # the calculate calls that ran, in order

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
        self._calls.append((a, op, b))
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
        self._calls = []
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
        step: dict[str, float] = {}
        if self.tool_reward:
            step["tool_ok"] = self.tool_reward * sum(r.ok and r.name == "calculate" for r in results)
        if not done:
            return step
        if self._answer is None:
            return {**step, "correct": 0.0, "format": -0.1}
        return {**step, "correct": float(self._answer == self._target)}

    def _state_key(self) -> str:
        return f"{_digest(self._expr.text() if self._expr else '')}:{sorted(self._computed)}"

    def expert_action(self) -> str | None:
        if self._work is None or self._expr is None:
            return None
        step = _next_step(self._work)
        if step is None:
            text = self._expr.text()
            if (
                self._calls
                and len(self._calls) == len(set(self._calls))
                and _unit(text) < self.expert_recheck
            ):
                a, op, b = self._calls[-1]  # double-check the last operation once
                return self.format_call("calculate", {"a": a, "op": op, "b": b})
            return self.format_call("answer", {"value": self._work.value})
        a, op, b = step
        return self.format_call("calculate", {"a": a, "op": op, "b": b})


def _copy(node: _Node) -> _Node:
    if node.op is None:
        return _Node(value=node.value)
    return _Node(op=node.op, left=_copy(node.left), right=_copy(node.right))  # type: ignore[arg-type]


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:10]


def _unit(text: str) -> float:
    """A number in [0, 1) fixed by ``text`` (independent of ``_digest``'s bits)."""
    return int(hashlib.sha256(text.encode()).hexdigest()[:13], 16) / 16**13
