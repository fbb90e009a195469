"""Argument helpers shared by the CLI commands (kept light: no heavy imports)."""

from __future__ import annotations

import json
from typing import Any

import typer


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
