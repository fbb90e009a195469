"""Authoring SDK: ``ToolEnv`` (declarative env base), ``turngym new`` scaffolding, ``turngym check PATH``."""

from turngym.sdk.tool_env import ToolEnv

__all__ = ["ToolEnv"]
