"""The agent protocol the rollout engine drives.

An ``Agent`` starts one ``AgentSession`` per trajectory; the engine then loops::

    session = agent.start(env, prompt, seed=seed, route=route)
    while not done:
        step = await session.act()                    # AgentStep: the action Message (+ finish reason)
        obs, reward, terminated, truncated, info = await env.astep(step.action)
        if not done:
            obs_span = session.observe(step.action, obs)   # may raise TokenMismatch
    session.export(trajectory)                        # token ids, loss mask, logprobs, metrics
    session.end()                                     # optional: the trajectory is over

LLM agents (``turngym.agents.llm.LLMAgent``) keep token bookkeeping; scripted, random and
chat-API agents produce text-only trajectories. ``act`` raises ``ContextFull`` when there is no
room left to generate (the engine truncates the trajectory), ``BackendError`` on inference
failures (the engine masks it).

Tree rollouts (``turngym.rollout.tree``) also need ``session.fork(env, seed=..., route=...)``: a new,
independent session in the same state (same messages and tokens so far) that acts on ``env`` (the
forked env) with its own sampling seed and route. ``TextSession`` and ``LLMSession`` implement it; a
session without ``fork`` cannot branch (the tree engine raises ``TreeError`` at its first branch).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Protocol

from turngym.core.types import Message, Trajectory


class ContextFull(Exception):
    """No room left in the model's context for another generation."""


@dataclass
class AgentStep:
    """One action. Token-level agents also say where its sampled ids lie in the sequence."""

    action: Message
    finish_reason: str | None = None
    gen_span: tuple[int, int] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    # the backend's side of the generation in seconds (queued, prefill, decode: turngym.rollout.ledger)
    timing: dict[str, float] = field(default_factory=dict)


class AgentSession(Protocol):
    async def act(self) -> AgentStep: ...

    def observe(self, action: Message, observation: list[Message]) -> tuple[int, int] | None: ...

    def export(self, trajectory: Trajectory) -> None: ...


class Agent(Protocol):
    """Makes one session per trajectory. ``seed`` makes sampling reproducible where supported."""

    name: str

    def start(self, env: Any, prompt: list[Message], *, seed: int | None, route: str) -> AgentSession: ...


class TextSession:
    """Base for agents without token bookkeeping: ``observe`` records the conversation only."""

    def __init__(self, prompt: list[Message]):
        self.messages: list[Message] = list(prompt)

    def observe(self, action: Message, observation: list[Message]) -> None:
        self.messages.extend([action, *observation])
        return None

    def export(self, trajectory: Trajectory) -> None:
        return None

    def fork(self, env: Any, *, seed: int | None, route: str) -> TextSession:
        """A copy in the same state that acts on ``env``; subclasses with per-session randomness
        reseed it in ``_forked``."""
        child = copy.copy(self)
        child.messages = list(self.messages)
        if hasattr(child, "env"):
            child.env = env
        child._forked(seed, route)
        return child

    def _forked(self, seed: int | None, route: str) -> None:
        """Hook: reseed the fork's own randomness (its seed and route are new)."""
