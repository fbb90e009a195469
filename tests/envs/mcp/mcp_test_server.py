"""A real MCP server for the ``mcp`` env tests, written with the official SDK (``MCPServer``).

Run as ``python mcp_test_server.py`` (stdio) or ``python mcp_test_server.py --http PORT`` (streamable
HTTP at ``/mcp``). Tools: a fact ``lookup``, a stateful ``increment`` counter, the server's ``pid``, and
the misbehaving ones the bad-input tests need: ``crash`` (the process exits), ``hang`` (sleeps),
``flood`` (a huge output), ``fail`` (an isError result) and ``weird`` (an input schema with ``not``,
which function calling cannot express).
"""

from __future__ import annotations

import os
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.tools.base import Tool

FACTS = {"python": "Python was first released in 1991.", "nile": "The Nile ends in the Mediterranean Sea."}


def weird(value: str) -> str:
    return value


# a tool whose input schema uses "not" (function calling cannot express it), as a third-party server may send
_weird = Tool.from_function(weird, name="weird", description="A tool whose schema uses 'not'.").model_copy(
    update={"parameters": {"type": "object", "properties": {"value": {"not": {"type": "integer"}}}}}
)
server = MCPServer("turngym-test", tools=[_weird])
_count = 0


@server.tool()
def lookup(topic: str) -> str:
    """Facts about a topic."""
    if topic not in FACTS:
        raise ValueError(f"no facts about {topic!r}")
    return FACTS[topic]


@server.tool()
def increment(by: int = 1) -> str:
    """Add ``by`` to this server's counter and return the new value."""
    global _count
    _count += by
    return str(_count)


@server.tool()
def pid() -> str:
    """The server's process id."""
    return str(os.getpid())


@server.tool()
def crash() -> str:
    """Exit the server process at once."""
    os._exit(3)


@server.tool()
def hang(seconds: float = 60.0) -> str:
    """Sleep ``seconds``."""
    time.sleep(seconds)
    return "woke up"


@server.tool()
def flood(chars: int) -> str:
    """Return ``chars`` characters."""
    return "x" * chars


@server.tool()
def fail() -> str:
    """Always fails."""
    raise RuntimeError("this tool always fails")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--http"]:
        server.run("streamable-http", port=int(sys.argv[2]))
    else:
        server.run()
