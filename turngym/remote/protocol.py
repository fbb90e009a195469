"""The wire protocol of ``turngym serve``: typed (pydantic) requests and replies.

One set of models serves both transports:

* HTTP: ``POST /sessions`` (:class:`CreateSession` -> :class:`SessionInfo`), then
  ``POST /sessions/{id}/reset|step|fork|limit_turns``, ``GET /sessions/{id}/tools|expert``,
  ``DELETE /sessions/{id}``; errors are 4xx/5xx with ``{"detail": {"error": ..., "kind": ...}}``.
* WebSocket ``/ws``: each frame is a :class:`WsRequest` (``op`` names the same operations, ``data``
  their request body) answered by a :class:`WsReply` with the same ``id``. Sessions a websocket
  creates (or ``attach``-es) belong to it and are closed when it closes.

Observations and infos travel faithfully: :class:`~turngym.core.types.Message` (images as base64),
``reward_components``, ``state_key``, ``reference`` (to trainers only: :data:`PRIVILEGED_INFO_KEYS`) and
``tool_results`` (as
:class:`~turngym.core.types.ToolResult`); any other info value is sent as JSON (bytes as base64,
anything else JSON cannot hold as its ``repr``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import to_jsonable_python

from turngym.core.types import Message, ToolResult, ToolSpec

PROTOCOL_VERSION = 1

#: error kinds a reply may carry, with their HTTP status
ERROR_STATUS: dict[str, int] = {
    "bad_request": 400,  # make kwargs the env rejects, or of the wrong type
    "malformed": 422,  # a message that is not the protocol's (bad JSON, missing or mistyped fields)
    "env_error": 400,  # the env refused the call (e.g. step before reset)
    "not_served": 403,  # a registered env this server does not serve
    "forbidden_arg": 403,  # a make() argument the client may not set (env_args)
    "trainer_only": 403,  # privileged (the expert's action) and the caller is no trainer
    "unauthorized": 401,  # no or wrong token (security.guard_app)
    "forbidden_host": 403,
    "forbidden_origin": 403,
    "too_large": 413,
    "unknown_session": 404,
    "unknown_env": 404,
    "not_forkable": 409,
    "server_full": 429,  # max sessions reached
    "internal": 500,
}


#: info keys only trainers get (``--trainer-token``): the gold answer and what derives from it or
#: names the server's host (see docs/interop.md, "Security"); an env may add its own with a
#: ``privileged_info`` attribute
PRIVILEGED_INFO_KEYS: frozenset[str] = frozenset(
    {
        "reference",
        "graded_commit",
        "container",
        "grade",
        "plan_evaluation",
        "judge_features",
        "verdict",
        "grounding",
    }
)
#: the most characters of an error message a reply carries
MAX_ERROR_CHARS = 500


def excerpt(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def public_info(info: dict[str, Any], extra: frozenset[str] | set[str] = frozenset()) -> dict[str, Any]:
    """``info`` without the privileged keys (:data:`PRIVILEGED_INFO_KEYS` and ``extra``)."""
    hidden = PRIVILEGED_INFO_KEYS | set(extra)
    return {k: v for k, v in info.items() if k not in hidden}


class ServeError(Exception):
    """A request the server refuses; ``kind`` is one of ``ERROR_STATUS``; the message is cut to
    :data:`MAX_ERROR_CHARS` (a reply never echoes a large input back)."""

    def __init__(self, kind: str, message: str):
        super().__init__(excerpt(message))
        self.kind = kind

    @property
    def status(self) -> int:
        return ERROR_STATUS.get(self.kind, 500)

    def body(self) -> ErrorBody:
        return ErrorBody(error=str(self), kind=self.kind)


class _Wire(BaseModel):
    """Non-finite floats (a reward of ``inf``, a ``nan`` metric) cross the wire as JSON's ``Infinity``
    and ``NaN`` tokens (which Python's and pydantic's JSON readers accept), never as ``null``."""

    model_config = ConfigDict(ser_json_inf_nan="constants")


class _Strict(_Wire):
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")


class CreateSession(_Strict):
    """Open a session: a new env ``make(env_id, **kwargs)`` on the server."""

    env_id: str | None = None  # None: the server's first served env
    kwargs: dict[str, Any] = Field(default_factory=dict)
    max_turns: int | None = Field(default=None, ge=1)  # tightens the env's own limit (Env.limit_turns)


class SessionInfo(_Wire):
    """What a client needs to drive a session's env like a local one."""

    session_id: str
    env_id: str
    tools: list[ToolSpec]
    instructions: str
    tools_in_prompt: bool = True
    parser: str = "hermes"
    max_turns: int
    forkable: bool = False
    turn: int = 0  # where the env is (a fork starts where its parent was)
    done: bool = True  # no episode running (never reset, or over)
    state_key: str | None = None
    protocol: int = PROTOCOL_VERSION


class ResetRequest(_Strict):
    seed: int | None = None
    options: dict[str, Any] | None = None


class ResetReply(_Wire):
    observation: list[Message]
    info: dict[str, Any]


class StepRequest(_Strict):
    action: str | Message


class StepReply(_Wire):
    observation: list[Message]
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]
    tool_results: list[ToolResult] = Field(default_factory=list)


class LimitTurns(_Strict):
    max_turns: int = Field(ge=1)


class LimitTurnsReply(_Wire):
    max_turns: int


class ToolsReply(_Wire):
    tools: list[ToolSpec]
    instructions: str


class ExpertReply(_Wire):
    action: str | Message | None


class AttachRequest(_Strict):
    session_id: str


class Closed(_Wire):
    closed: bool


class ErrorBody(_Wire):
    error: str
    kind: str


class Health(_Wire):
    status: Literal["ok"] = "ok"
    envs: list[str]
    sessions: int
    max_sessions: int
    idle_timeout: float | None
    stats: dict[str, int] = Field(default_factory=dict)  # opened, closed (idle, disconnect), refused_full
    protocol: int = PROTOCOL_VERSION


Op = Literal["create", "attach", "reset", "step", "tools", "expert", "limit_turns", "fork", "close"]


class WsRequest(_Strict):
    id: int | str = 0
    op: Op
    session_id: str | None = None  # every op but create/attach names its session
    data: dict[str, Any] = Field(default_factory=dict)


class WsReply(_Wire):
    id: int | str | None = None
    ok: bool
    data: dict[str, Any] | None = None
    error: ErrorBody | None = None


def jsonable(value: Any) -> Any:
    """``value`` as JSON can hold it: bytes as base64, pydantic models dumped, numpy values as numbers and
    lists, anything else as its ``repr``."""
    return to_jsonable_python(value, bytes_mode="base64", fallback=_fallback)


def _fallback(value: Any) -> Any:
    tolist = getattr(value, "tolist", None)  # numpy scalars and arrays
    if callable(tolist):
        return jsonable(tolist())
    return repr(value)


def info_to_wire(info: dict[str, Any]) -> tuple[dict[str, Any], list[ToolResult]]:
    """Split a step ``info`` into its JSON part and its typed ``tool_results``."""
    rest = {k: v for k, v in info.items() if k != "tool_results"}
    results = [
        r if isinstance(r, ToolResult) else ToolResult.model_validate(r)
        for r in info.get("tool_results") or []
    ]
    return jsonable(rest), results
