"""The scripted expert of ``gui-desktop``: each task's plan (:mod:`turngym.envs.desktop.tasks`) rendered,
one step a turn, as the same computer tool calls a policy makes (type, press, wait, click at pixels).

A ``click_node`` step finds its target (role and name) in the live accessibility tree, privately, and
clicks the center of its box in screenshot pixels; after the last step the expert calls ``done``. The
expert proves each task solvable through the GUI alone: ``tests`` run it over the tasks.
"""

from __future__ import annotations

from typing import Any

from turngym.core.types import ToolCall


def _find(nodes: list[dict[str, Any]], role: str, name: str) -> dict[str, Any] | None:
    for n in nodes:
        if n.get("role") == role and n.get("name") == name and n.get("w", 0) > 0 and n.get("h", 0) > 0:
            return n
    return None


def render_step(env: Any, step: tuple[Any, ...]) -> ToolCall | None:
    """One plan step as a tool call (None if its target cannot be found now)."""
    kind = step[0]
    if kind == "type":
        return ToolCall(name="type", arguments={"text": step[1]})
    if kind == "key":
        return ToolCall(name="press", arguments={"key": step[1]})
    if kind == "wait":
        return ToolCall(name="wait", arguments={"seconds": step[1]})
    if kind == "click_node":
        node = _find(env.desk.a11y_nodes() if env.desk is not None else [], step[1], step[2])
        if node is None:
            return None
        x = int((node["x"] + node["w"] / 2) / env._scale)
        y = int((node["y"] + node["h"] / 2) / env._scale)
        return ToolCall(name="click", arguments={"x": x, "y": y})
    raise ValueError(f"unknown expert step {step!r}")


def next_call(env: Any) -> ToolCall | None:
    """The expert's next call for ``env``'s episode (``done`` once the plan is through)."""
    plan = env.current.plan
    if env._plan_pos >= len(plan):
        return ToolCall(name="done", arguments={})
    call = render_step(env, plan[env._plan_pos])
    env._plan_pos += 1
    if call is None:  # the target is not there (yet): give it a moment, then go on with the plan
        return ToolCall(name="wait", arguments={"seconds": 0.5})
    return call
