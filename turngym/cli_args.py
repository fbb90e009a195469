"""What the CLI commands share (kept light: no heavy imports): argument helpers, the consoles, and
``CLIError`` (an expected failure: ``turngym.cli.main`` prints it as one line, exit code 2)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console

console = Console()
err_console = Console(stderr=True)


class CLIError(Exception):
    """An expected failure: printed as one line, exit code 2."""


KwOption = Annotated[
    list[str] | None,
    typer.Option("--env-arg", help="Env constructor argument KEY=VALUE (JSON value); repeatable."),
]


def make_env(env_id: str, kwargs: list[str] | None) -> Any:
    """``turngym.make(env_id)`` with ``--env-arg KEY=VALUE`` constructor arguments."""
    from turngym.core.registry import make

    return make(env_id, **parse_key_values(kwargs or []))


def parse_key_values(items: list[str] | None, flag: str = "--env-arg") -> dict[str, Any]:
    """``["depth=3", "name=x", 'kinds=["a"]']`` -> ``{"depth": 3, "name": "x", "kinds": ["a"]}``.

    Values are read as JSON when they parse, else kept as strings.
    """
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"{flag} needs KEY=VALUE, got {item!r}")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out
