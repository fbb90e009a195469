"""turngym: multi-turn RL for LLM agents.

``env = turngym.make("search-qa")``; ``obs, info = env.reset(seed=0)``;
``obs, reward, terminated, truncated, info = env.step(action)``.
Importing turngym stays light: heavy dependencies load when an env is made.
"""

from turngym.core import (
    EnvProtocol,
    EnvSpec,
    ForkError,
    Message,
    NotForkable,
    Task,
    ToolCall,
    ToolResult,
    ToolSpec,
    Trajectory,
    Turn,
    UnknownEnvError,
    make,
    register,
    registry,
    spec,
)
from turngym.envs import catalog as _catalog  # noqa: F401  (registers the built-in envs, lazily)
from turngym.tools import ToolBox, ToolError, ToolOutput, tool
from turngym.tools.env import AsyncEnv, Env

__version__ = "0.1.0"

__all__ = [
    "AsyncEnv",
    "Env",
    "EnvProtocol",
    "EnvSpec",
    "ForkError",
    "Message",
    "NotForkable",
    "Task",
    "ToolBox",
    "ToolCall",
    "ToolError",
    "ToolOutput",
    "ToolResult",
    "ToolSpec",
    "Trajectory",
    "Turn",
    "UnknownEnvError",
    "__version__",
    "make",
    "register",
    "registry",
    "spec",
    "tool",
]
