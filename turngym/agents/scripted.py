"""Agents without a model: the env's scripted expert, and a random agent.

* ``ScriptedAgent`` plays ``env.expert_action()`` (privileged, per family); envs without an expert
  make it raise ``AgentError``.
* ``RandomAgent`` calls a random tool with arguments drawn from the tool's JSON schema, and with
  probability ``p_malformed`` writes a malformed action instead. It speaks the env's parser
  convention (Hermes text, tags, or structured OpenAI tool calls). Useful as a baseline and for
  fault-injection runs.

Both produce text-only trajectories (no token ids).
"""

from __future__ import annotations

import inspect
import random
import string
from typing import Any

from turngym.agents.base import AgentStep, TextSession
from turngym.core.types import Message, ToolCall, ToolSpec
from turngym.tools.parsers import get_parser


class AgentError(RuntimeError):
    """The agent cannot act (e.g. the env has no scripted expert)."""


class ScriptedAgent:
    name = "scripted"

    def start(self, env: Any, prompt: list[Message], *, seed: int | None, route: str) -> _ScriptedSession:
        return _ScriptedSession(env, prompt)


class _ScriptedSession(TextSession):
    def __init__(self, env: Any, prompt: list[Message]):
        super().__init__(prompt)
        self.env = env

    async def act(self) -> AgentStep:
        base = getattr(self.env, "unwrapped", self.env)
        action = base.expert_action()
        if inspect.isawaitable(action):
            action = await action
        if action is None:
            raise AgentError(f"{type(base).__name__} has no scripted expert action")
        if isinstance(action, Message):
            return AgentStep(action, "stop")
        return AgentStep(Message(role="assistant", content=str(action)), "stop")


class RandomAgent:
    name = "random"

    def __init__(self, p_malformed: float = 0.1, seed: int = 0):
        self.p_malformed = p_malformed
        self.seed = seed

    def start(self, env: Any, prompt: list[Message], *, seed: int | None, route: str) -> _RandomSession:
        rng = random.Random(f"{self.seed}:{seed}:{route}")  # str seeds are stable across processes
        return _RandomSession(env, prompt, rng, self.p_malformed, self.seed)


class _RandomSession(TextSession):
    def __init__(
        self, env: Any, prompt: list[Message], rng: random.Random, p_malformed: float, agent_seed: int = 0
    ):
        super().__init__(prompt)
        self.env = env
        self.rng = rng
        self.p_malformed = p_malformed
        self.agent_seed = agent_seed

    def _forked(self, seed: int | None, route: str) -> None:
        self.rng = random.Random(f"{self.agent_seed}:{seed}:{route}")  # a branch draws its own actions

    async def act(self) -> AgentStep:
        rng = self.rng
        base = getattr(self.env, "unwrapped", self.env)
        tools: list[ToolSpec] = list(base.tools)
        if not tools or rng.random() < self.p_malformed:
            junk = rng.choice(
                ["<tool_call>{not json", "I am not sure.", '<tool_call>{"name": 3}</tool_call>', ""]
            )
            return AgentStep(Message(role="assistant", content=junk), "stop")
        spec = rng.choice(tools)
        call = ToolCall(name=spec.name, arguments=random_value(spec.parameters, rng) or {})
        return AgentStep(_format_call(base.parser, call), "stop")


def _format_call(parser: Any, call: ToolCall) -> Message:
    """The call in the env's convention (``parser.format_call``); a parser without it, or one that
    cannot write this call, gets the default convention's."""
    fmt = getattr(parser, "format_call", None)
    try:
        action = fmt(call) if fmt is not None else get_parser().format_call(call)
    except ValueError:  # not writable in this protocol (a tag parser with no tag for the tool)
        action = get_parser().format_call(call)
    return action if isinstance(action, Message) else Message(role="assistant", content=action)


def random_value(schema: dict[str, Any], rng: random.Random, depth: int = 0) -> Any:
    """A random value that (mostly) satisfies a JSON schema; enough for tool arguments."""
    if "enum" in schema:
        return rng.choice(schema["enum"])
    if "const" in schema:
        return schema["const"]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return random_value(rng.choice(schema[key]), rng, depth + 1)
    kind = schema.get("type", "string")
    if isinstance(kind, list):
        kind = rng.choice(kind)
    if kind == "object":
        props = schema.get("properties", {})
        required = set(schema.get("required", props))
        return {
            k: random_value(v, rng, depth + 1)
            for k, v in props.items()
            if k in required or rng.random() < 0.5
        }
    if kind == "array":
        n = 0 if depth > 3 else rng.randint(schema.get("minItems", 0), max(schema.get("minItems", 0), 3))
        return [random_value(schema.get("items", {}), rng, depth + 1) for _ in range(n)]
    if kind == "integer":
        return rng.randint(int(schema.get("minimum", -100)), int(schema.get("maximum", 100)))
    if kind == "number":
        return rng.uniform(float(schema.get("minimum", -100)), float(schema.get("maximum", 100)))
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    return "".join(rng.choice(string.ascii_lowercase + " ") for _ in range(rng.randint(1, 12)))
