"""A small MCP server (the official SDK's ``MCPServer``) and its tasks: the ``mcp`` family's default.

``turngym.make("mcp")`` with no ``servers=`` starts this server over stdio (``python
<path of this file>``; it imports only ``mcp``) and asks :data:`DEMO_TASKS`, so the family runs, plays and passes
``turngym check`` with nothing to configure. ``python -m turngym.envs.mcp.demo_server --http PORT`` serves it
over streamable HTTP at ``http://127.0.0.1:PORT/mcp`` instead.

Tools: ``lookup(topic)`` (facts from a fixed table) and ``subtract(a, b)``; both read-only.
"""

from __future__ import annotations

import sys

FACTS = {
    "mount everest": "Mount Everest is 8849 metres high; it lies on the border of Nepal and China.",
    "mont blanc": "Mont Blanc is 4806 metres high; it lies on the border of France and Italy.",
    "python": "The Python programming language was created by Guido van Rossum and first released in 1991.",
    "nile": "The Nile flows north through eleven countries and ends in the Mediterranean Sea in Egypt.",
    "ada lovelace": "Ada Lovelace wrote the first published computer program, for Babbage's Analytical Engine.",
}

DEMO_TASKS = [
    {
        "id": "demo-python-year",
        "prompt": "In which year was the Python programming language first released? Use the lookup tool.",
        "answer": "1991",
        "solution": [{"name": "lookup", "arguments": {"topic": "python"}}],
    },
    {
        "id": "demo-nile-sea",
        "prompt": "Into which sea does the Nile flow? Use the lookup tool.",
        "answers": ["Mediterranean Sea", "the Mediterranean"],
        "solution": [{"name": "lookup", "arguments": {"topic": "nile"}}],
    },
    {
        "id": "demo-everest-minus-blanc",
        "prompt": "How many metres higher is Mount Everest than Mont Blanc? Look both up, then subtract.",
        "answer": "4043",
        "solution": [
            {"name": "lookup", "arguments": {"topic": "mount everest"}},
            {"name": "lookup", "arguments": {"topic": "mont blanc"}},
            {"name": "subtract", "arguments": {"a": 8849, "b": 4806}},
        ],
    },
    {
        "id": "demo-lovelace",
        "prompt": "Who wrote the first published computer program? Use the lookup tool (topic: ada lovelace).",
        "answer": "Ada Lovelace",
        "solution": [{"name": "lookup", "arguments": {"topic": "ada lovelace"}}],
    },
]


def build_server():  # noqa: ANN201 - the SDK's MCPServer, imported lazily
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("turngym-demo")

    @server.tool()
    def lookup(topic: str) -> str:
        """Look up facts about a topic (e.g. 'mount everest', 'python', 'nile')."""
        fact = FACTS.get(topic.strip().lower())
        if fact is None:
            raise ValueError(f"no facts about {topic!r}; known topics: {', '.join(sorted(FACTS))}")
        return fact

    @server.tool()
    def subtract(a: float, b: float) -> float:
        """Compute a - b."""
        return a - b

    return server


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    server = build_server()
    if args[:1] == ["--http"]:
        port = int(args[1]) if len(args) > 1 else 8000
        server.run("streamable-http", port=port)
    else:
        server.run()


if __name__ == "__main__":
    main()
