"""The core contract: types, env base classes, spaces, registry and wrappers."""

from turngym.core.env import AsyncEnv, Env, ForkError, NotForkable, Task
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
    "AsyncEnv",
    "AsyncWrapper",
    "Env",
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
    "UnknownEnvError",
    "afork_env",
    "fork_env",
    "make",
    "register",
    "registry",
    "spec",
]
