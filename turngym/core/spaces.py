"""Gymnasium spaces for chat observations (lists of ``Message``) and actions (text or ``Message``).

Chat values have no fixed size, so they cannot live in the fixed buffers of
``AsyncVectorEnv(shared_memory=True)`` (gymnasium's default); asking for that raises
:class:`SharedMemoryUnsupported`, which says what to pass instead (``shared_memory=False``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import create_shared_memory

from turngym.core.types import Message, ToolSpec

_T = TypeVar("_T")
_ALPHABET = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,:;!?-_'\"{}[]<>/\n"


class _ChatSpace(spaces.Space[_T]):
    """A space of chat values: no fixed shape or dtype, and not flattenable to a numpy array."""

    def __init__(self, seed: int | np.random.Generator | None = None):
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False


class MessagesSpace(_ChatSpace[list[Message]]):
    """A list of chat messages. ``contains`` checks the type of every element."""

    def __init__(self, max_messages: int = 1024, seed: int | np.random.Generator | None = None):
        self.max_messages = max_messages
        super().__init__(seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, list) and len(x) <= self.max_messages and all(isinstance(m, Message) for m in x)

    def sample(self, mask: Any = None, probability: Any = None) -> list[Message]:
        n = int(self.np_random.integers(1, 4))
        roles = ("user", "tool")
        return [
            Message(
                role=roles[int(self.np_random.integers(len(roles)))], content=_random_text(self.np_random, 40)
            )
            for _ in range(n)
        ]

    def to_jsonable(self, sample_n: Sequence[list[Message]]) -> list[list[dict[str, Any]]]:
        return [[m.model_dump(mode="json") for m in s] for s in sample_n]

    def from_jsonable(self, sample_n: list[list[dict[str, Any]]]) -> list[list[Message]]:
        return [[Message.model_validate(m) for m in s] for s in sample_n]

    def __repr__(self) -> str:
        return f"MessagesSpace(max_messages={self.max_messages})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MessagesSpace) and other.max_messages == self.max_messages


class ActionSpace(_ChatSpace[str]):
    """The assistant's output: text (parsed by the env's tool-call parser) or a ``Message``.

    ``sample`` draws a mix of well-formed calls to the env's tools (with random
    arguments), malformed calls and plain text, so random agents exercise both paths.
    """

    def __init__(self, tools: Sequence[ToolSpec] = (), max_length: int = 1_000_000, seed: Any = None):
        self.tools = list(tools)
        self.max_length = max_length
        super().__init__(seed)

    def contains(self, x: Any) -> bool:
        if isinstance(x, Message):
            return x.role == "assistant"
        return isinstance(x, str) and len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        rng = self.np_random
        kind = rng.random()
        non_terminal = [t for t in self.tools if not t.terminal] or self.tools
        if non_terminal and kind < 0.7:
            spec = non_terminal[int(rng.integers(len(non_terminal)))]
            args = _sample_arguments(spec.parameters, rng)
            return f"<tool_call>{json.dumps({'name': spec.name, 'arguments': args})}</tool_call>"
        if kind < 0.85:
            return "<tool_call>{not json" + _random_text(rng, 10)
        return _random_text(rng, 60)

    def __repr__(self) -> str:
        return f"ActionSpace(tools={[t.name for t in self.tools]})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ActionSpace) and other.tools == self.tools


class SharedMemoryUnsupported(TypeError):
    """``AsyncVectorEnv`` was asked to put chat observations in shared memory."""


@create_shared_memory.register(_ChatSpace)
def _no_shared_memory(space: _ChatSpace, n: int = 1, ctx: Any = None) -> Any:
    raise SharedMemoryUnsupported(
        f"turngym observations ({space!r}: lists of chat messages of any length, images included) cannot "
        "be kept in AsyncVectorEnv's fixed shared-memory buffers. Pass shared_memory=False: "
        "AsyncVectorEnv(env_fns, shared_memory=False), or gymnasium.make_vec(ENV_ID, num_envs=N, "
        'vectorization_mode="async", vector_kwargs={"shared_memory": False}). SyncVectorEnv needs nothing.'
    )


def _random_text(rng: np.random.Generator, max_len: int) -> str:
    n = int(rng.integers(1, max_len + 1))
    idx = rng.integers(0, len(_ALPHABET), size=n)
    return "".join(_ALPHABET[i] for i in idx)


def _sample_arguments(schema: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, prop in (schema.get("properties") or {}).items():
        out[name] = _sample_value(prop, rng)
    return out


def _sample_value(prop: dict[str, Any], rng: np.random.Generator) -> Any:
    if "enum" in prop:
        return prop["enum"][int(rng.integers(len(prop["enum"])))]
    if "anyOf" in prop:
        options = [p for p in prop["anyOf"] if p.get("type") != "null"] or prop["anyOf"]
        return _sample_value(options[int(rng.integers(len(options)))], rng)
    t = prop.get("type")
    lo = prop.get("minimum", 0)
    hi = prop.get("maximum", lo + 10)
    if t == "integer":
        return int(rng.integers(int(lo), int(hi) + 1))
    if t == "number":
        return float(rng.uniform(lo, hi))
    if t == "boolean":
        return bool(rng.integers(2))
    if t == "array":
        return [
            _sample_value(prop.get("items", {"type": "string"}), rng) for _ in range(int(rng.integers(0, 3)))
        ]
    if t == "object":
        return {}
    return _random_text(rng, 20)
