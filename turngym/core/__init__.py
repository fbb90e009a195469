"""The core contract: types, the env protocol, spaces, registry and wrappers."""

from turngym.core.env import EnvProtocol, ForkError, NotForkable, Task, TurnLimited
from turngym.core.registry import EnvSpec, UnknownEnvError, make, register, registry, spec
from turngym.core.spaces import ActionSpace, MessagesSpace
from turngym.core.types import Message, ToolCall, ToolResult, ToolSpec, Trajectory, Turn
from turngym.core.wrappers import (
    AsyncWrapper,
    RecordRewardComponents,
    RecordTrajectory,
    TurnLimit,
    afork_env,
    fork_env,
)

__all__ = [
    "ActionSpace",
    "AsyncWrapper",
    "EnvProtocol",
    "EnvSpec",
    "ForkError",
    "Message",
    "MessagesSpace",
    "NotForkable",
    "RecordRewardComponents",
    "RecordTrajectory",
    "Task",
    "ToolCall",
    "ToolResult",
    "ToolSpec",
    "Trajectory",
    "Turn",
    "TurnLimit",
    "TurnLimited",
    "UnknownEnvError",
    "afork_env",
    "fork_env",
    "make",
    "register",
    "registry",
    "spec",
]
