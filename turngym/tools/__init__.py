"""Tools: ``@tool`` -> ``ToolSpec``, call parsers, the ``ToolBox`` dispatcher, and (``turngym.tools.env``) the
chat-and-tools ``Env`` built on them."""

from turngym.tools.decorator import BoundTool, ToolDef, tool, tool_def, tools_of
from turngym.tools.parsers import (
    HermesParser,
    OpenAIParser,
    ParsedCall,
    ParseResult,
    TagParser,
    ToolCallParser,
    get_parser,
)
from turngym.tools.toolbox import BadArguments, ToolBox, ToolError, ToolOutput, truncate

__all__ = [
    "BadArguments",
    "BoundTool",
    "HermesParser",
    "OpenAIParser",
    "ParseResult",
    "ParsedCall",
    "TagParser",
    "ToolBox",
    "ToolCallParser",
    "ToolDef",
    "ToolError",
    "ToolOutput",
    "get_parser",
    "tool",
    "tool_def",
    "tools_of",
    "truncate",
]
