"""The ``mcp`` env family: tools from MCP servers, tasks from a dataset (see ``turngym.envs.mcp.env``)."""
