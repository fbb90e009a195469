"""Core data types shared by environments, agents, the rollout engine and the trainer.

Everything here is a pydantic model that round-trips through JSON without loss
(images travel as base64-encoded PNG bytes).
"""

from __future__ import annotations

import copy
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Role = Literal["system", "user", "assistant", "tool"]

_BYTES_AS_BASE64 = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")


class ToolCall(BaseModel):
    """One call of a tool: a name and its JSON arguments."""

    id: str = ""
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)},
        }


class Message(BaseModel):
    """A chat message. ``images`` hold PNG bytes (base64 in JSON)."""

    model_config = _BYTES_AS_BASE64

    role: Role
    content: str = ""
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    images: list[bytes] = Field(default_factory=list)

    def to_chat(self) -> dict[str, Any]:
        """The dict form chat templates and OpenAI-style APIs take (images left out)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            out["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        return out


class ToolSpec(BaseModel):
    """A tool as the model sees it: OpenAI function-calling schema."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    terminal: bool = False

    def to_openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def openai_json(self) -> str:
        """``json.dumps(self.to_openai(), ensure_ascii=False)``, kept while the spec's fields stay
        equal to when it was made: a prompt lists the same tools every episode, and dumping their
        schemas was a quarter of an episode's start in the engine (a dict comparison is far cheaper)."""
        fields = (self.name, self.description, self.parameters)
        hit = _SPEC_JSON.get(id(self))
        if hit is not None and hit[0] is self and hit[1] == fields:
            return hit[2]
        text = json.dumps(self.to_openai(), ensure_ascii=False)
        if len(_SPEC_JSON) >= _SPEC_JSON_MAX:
            _SPEC_JSON.clear()
        _SPEC_JSON[id(self)] = (self, copy.deepcopy(fields), text)
        return text


# ToolSpec.openai_json's texts by spec identity (the entry holds the spec, so its id is not reused)
_SPEC_JSON: dict[int, tuple[ToolSpec, tuple[str, str, dict[str, Any]], str]] = {}
_SPEC_JSON_MAX = 4096


class ToolResult(BaseModel):
    """What a tool call produced. ``ok`` is False for every failure, with ``error`` saying why."""

    model_config = _BYTES_AS_BASE64

    call_id: str = ""
    name: str
    content: str = ""
    ok: bool = True
    error: str | None = None
    error_kind: str | None = None
    truncated: bool = False
    images: list[bytes] = Field(default_factory=list)
    elapsed_s: float = 0.0

    def __eq__(self, other: object) -> bool:
        """Equal results are equal whatever their timing (``elapsed_s`` is not compared)."""
        if not isinstance(other, ToolResult):
            return NotImplemented
        skip = {"elapsed_s"}
        return self.model_dump(exclude=skip) == other.model_dump(exclude=skip)

    __hash__ = None  # type: ignore[assignment]


class Turn(BaseModel):
    """One assistant action and the observation that followed it.

    Token fields are filled by the rollout engine: ``gen_span``/``obs_span`` are
    half-open ``[start, end)`` ranges into ``Trajectory.token_ids``.
    """

    index: int
    action: Message
    observation: list[Message] = Field(default_factory=list)
    tool_results: list[ToolResult] = Field(default_factory=list)
    reward: float = 0.0
    reward_components: dict[str, float] = Field(default_factory=dict)
    invalid_action: bool = False
    error: str = ""
    state_key: str | None = None
    terminated: bool = False
    truncated: bool = False
    gen_span: tuple[int, int] | None = None
    obs_span: tuple[int, int] | None = None
    finish_reason: str | None = None
    info: dict[str, Any] = Field(default_factory=dict)
    # seconds per phase of this turn: generate, env_step, observe, generate/queued|prefill|decode
    # (see turngym.rollout.ledger)
    timing: dict[str, float] = Field(default_factory=dict)
    # tree rollouts (turngym.rollout.tree): this turn's node and the node it continued from (the state
    # it acted in; ``"root"`` for the first turn). Siblings of one branch point share ``parent_id``.
    # None in flat rollouts.
    node_id: str | None = None
    parent_id: str | None = None


class Trajectory(BaseModel):
    """A whole episode: first observation, turns, and (after a rollout) tokens and masks."""

    model_config = _BYTES_AS_BASE64

    env_id: str = ""
    task_id: str = ""
    seed: int | None = None
    group: str = ""
    sample: int = 0
    prompt: list[Message] = Field(default_factory=list)
    turns: list[Turn] = Field(default_factory=list)
    reference: dict[str, Any] = Field(default_factory=dict)
    start_state_key: str | None = None
    terminated: bool = False
    truncated: bool = False
    masked: bool = False
    mask_reason: str = ""
    # token bookkeeping (filled by the rollout engine; empty for text-only runs)
    token_ids: list[int] = Field(default_factory=list)
    loss_mask: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    prompt_len: int = 0
    metrics: dict[str, float] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)

    # ---- derived ----
    @property
    def total_reward(self) -> float:
        return float(sum(t.reward for t in self.turns))

    @property
    def outcome(self) -> float:
        """Reward of the last turn (the outcome for families that pay at the end)."""
        return float(self.turns[-1].reward) if self.turns else 0.0

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    def messages(self) -> list[Message]:
        """The whole conversation: prompt, then each action and its observation."""
        out = list(self.prompt)
        for t in self.turns:
            out.append(t.action)
            out.extend(t.observation)
        return out

    # ---- building from env steps ----
    @classmethod
    def start(cls, obs: list[Message], info: dict[str, Any], **fields: Any) -> Trajectory:
        return cls(
            prompt=list(obs),
            task_id=str(info.get("task_id", "")),
            reference=dict(info.get("reference") or {}),
            start_state_key=_key(info.get("state_key")),
            **fields,
        )

    def record_step(
        self,
        action: Message,
        obs: list[Message],
        reward: float,
        terminated: bool,
        truncated: bool,
        info: dict[str, Any],
    ) -> Turn:
        extra = {
            k: v
            for k, v in info.items()
            if k
            not in {
                "reward_components",
                "invalid_action",
                "error",
                "state_key",
                "turn",
                "task_id",
                "reference",
                "tool_results",
            }
        }
        turn = Turn(
            index=len(self.turns),
            action=action,
            observation=list(obs),
            tool_results=list(info.get("tool_results") or []),
            reward=float(reward),
            reward_components=dict(info.get("reward_components") or {}),
            invalid_action=bool(info.get("invalid_action", False)),
            error=str(info.get("error") or ""),
            state_key=_key(info.get("state_key")),
            terminated=bool(terminated),
            truncated=bool(truncated),
            info=_jsonable(extra),
        )
        self.turns.append(turn)
        self.terminated, self.truncated = bool(terminated), bool(truncated)
        if info.get("reference"):
            self.reference = dict(info["reference"])
        return turn

    # ---- JSON ----
    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | bytes) -> Trajectory:
        return cls.model_validate_json(text)


def _key(value: Any) -> str | None:
    return None if value is None else str(value)


def _jsonable(value: Any) -> Any:
    """Keep only what JSON can hold, so a trajectory never fails to save."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        if isinstance(value, dict):
            return {str(k): _jsonable(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [_jsonable(v) for v in value]
        return repr(value)
