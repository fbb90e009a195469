"""How an ``mcp`` env reaches its MCP servers: one :class:`ServerConfig` per server.

A server is a stdio command (``command`` + ``args``, started as a child process) or a streamable-HTTP
URL. ``lifecycle`` says who owns it:

* ``"shared"`` (read-only tools: search, lookup, calculators): one connection per process and config,
  reference-counted across the envs that use it, started by the first env built and stopped when the last
  one closes;
* ``"per_episode"`` (stateful tools: a counter, a file system, a database): a fresh server at every
  ``reset``, stopped at the next reset and at ``close``.

``load_servers`` accepts configs, dicts, a JSON file holding a list of them, or a JSON object
``{"servers": [...]}`` / ``{"mcpServers": {name: {...}}}`` (the shape MCP clients such as Claude Desktop
write: ``command``/``args``/``env`` or ``url``).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,40}$")


class ServerConfig(BaseModel):
    """One MCP server: where it is, how long its calls may take, and its lifecycle."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    transport: Literal["stdio", "http"] = "stdio"
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    #: seconds one tool call may take; then the call is an error observation (``error_kind="timeout"``)
    timeout: float = Field(30.0, gt=0)
    #: seconds to start the server (stdio) or reach it (http) and list its tools
    connect_timeout: float = Field(30.0, gt=0)
    lifecycle: Literal["shared", "per_episode"] = "shared"
    #: prefix every tool of this server with ``<name>__`` (tools are prefixed anyway when names collide)
    prefix: bool = False
    #: only these tools of the server (by the server's names); None: all of them
    include: list[str] | None = None

    @model_validator(mode="after")
    def _check(self) -> ServerConfig:
        if not _NAME.match(self.name):
            raise ValueError(
                f"server name {self.name!r} must match [A-Za-z0-9_-]{{1,40}} (it prefixes tool names)"
            )
        if self.transport == "stdio":
            if not self.command:
                raise ValueError(f"server {self.name!r}: a stdio server needs a command")
            if self.url:
                raise ValueError(f"server {self.name!r}: a stdio server takes a command, not a url")
        else:
            if not self.url or not self.url.startswith(("http://", "https://")):
                raise ValueError(
                    f"server {self.name!r}: an http server needs an http(s) url, got {self.url!r}"
                )
            if self.command:
                raise ValueError(f"server {self.name!r}: an http server takes a url, not a command")
        return self

    def describe(self) -> str:
        """``stdio: python -m x`` or ``http: http://host/mcp`` (for error messages)."""
        if self.transport == "stdio":
            return "stdio: " + " ".join([str(self.command), *self.args])
        return f"http: {self.url}"


def _from_mapping(data: dict[str, Any], where: str) -> list[dict[str, Any]]:
    if "mcpServers" in data:  # the Claude Desktop / MCP client file shape
        servers = data["mcpServers"]
        if not isinstance(servers, dict):
            raise ValueError(f"{where}: 'mcpServers' must map names to servers")
        out = []
        for name, spec in servers.items():
            if not isinstance(spec, dict):
                raise ValueError(f"{where}: server {name!r} must be an object")
            spec = dict(spec)
            spec.pop("type", None)
            transport = "http" if "url" in spec else "stdio"
            out.append({"name": name, "transport": transport, **spec})
        return out
    if "servers" in data:
        if not isinstance(data["servers"], list):
            raise ValueError(f"{where}: 'servers' must be a list")
        return data["servers"]
    return [data]


def load_servers(spec: Any) -> list[ServerConfig]:
    """Server configs from configs, dicts, a JSON string or a JSON file (see the module docstring).

    Raises ``ValueError`` naming the file and the server when a config is invalid or names repeat.
    """
    where = "servers"
    if isinstance(spec, (str, os.PathLike)):
        text = str(spec)
        if text.lstrip().startswith(("[", "{")):
            data: Any = json.loads(text)
        else:
            path = Path(text)
            if not path.is_file():
                raise ValueError(
                    f"servers: no such file {str(path)!r} (give a JSON file or a list of configs)"
                )
            where = str(path)
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not valid JSON: {e}") from e
    else:
        data = spec
    if isinstance(data, (ServerConfig, dict)):
        data = [data]
    if not isinstance(data, list):
        raise ValueError(f"{where}: expected a list of server configs, got {type(data).__name__}")
    items: list[Any] = []
    for item in data:
        items.extend(_from_mapping(item, where) if isinstance(item, dict) else [item])
    out: list[ServerConfig] = []
    for i, item in enumerate(items):
        if isinstance(item, ServerConfig):
            out.append(item)
            continue
        if not isinstance(item, dict):
            raise ValueError(f"{where}: server {i} must be an object, got {type(item).__name__}")
        try:
            out.append(ServerConfig.model_validate(item))
        except ValidationError as e:
            label = item.get("name", i)
            msgs = "; ".join(f"{'.'.join(map(str, x['loc'])) or 'config'}: {x['msg']}" for x in e.errors())
            raise ValueError(f"{where}: server {label!r}: {msgs}") from None
    names = [c.name for c in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"{where}: server names must be unique, repeated: {', '.join(dupes)}")
    if not out:
        raise ValueError(f"{where}: no servers given")
    return out
