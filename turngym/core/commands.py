"""CLI: ``turngym envs`` (the registry's listing) and ``turngym info ENV`` (one env's tools and spaces)."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.panel import Panel
from rich.table import Table

from turngym.cli_args import KwOption, console, err_console, make_env


def envs_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    all_versions: Annotated[
        bool, typer.Option("--all", help="List every version, not just the latest.")
    ] = False,
) -> None:
    """List the registered environments."""
    from turngym.core.registry import registry

    specs = [registry[i] for i in registry] if all_versions else registry.latest()
    if as_json:
        rows = [
            {
                "id": s.id,
                "name": s.name,
                "version": s.version,
                "family": s.family,
                "entry_point": s.entry_point if isinstance(s.entry_point, str) else repr(s.entry_point),
                "defaults": s.kwargs,
                "requires": list(s.requires),
                "source": s.source,
                "description": s.description,
            }
            for s in specs
        ]
        print(json.dumps(rows, indent=2, default=str))
        return
    table = Table(title="turngym environments")
    for col in ("id", "family", "requires", "description"):
        table.add_column(col, overflow="fold")
    for s in specs:
        table.add_row(s.id, s.family, ",".join(s.requires) or "-", s.description)
    console.print(table)
    for name, error in registry.plugin_errors.items():
        err_console.print(f"[yellow]plugin {name!r} failed to load: {error}[/yellow]")


def info_command(env_id: str, kw: KwOption = None) -> None:
    """Show an environment's tools, spaces and defaults."""
    from turngym.core.registry import spec as get_spec

    s = get_spec(env_id)
    env = make_env(env_id, kw)
    try:
        console.print(Panel.fit(f"[bold]{s.id}[/bold]  ({s.family})\n{s.description}", title="env"))
        meta = Table(show_header=False)
        meta.add_row("entry point", str(s.entry_point))
        meta.add_row("defaults", json.dumps(s.kwargs, default=str))
        meta.add_row("max turns", str(env.max_turns))
        meta.add_row("parser", env.parser.name)
        meta.add_row("observation space", repr(env.observation_space))
        meta.add_row("action space", repr(env.action_space))
        console.print(meta)
        tools = Table(title="tools")
        tools.add_column("name")
        tools.add_column("terminal")
        tools.add_column("arguments", overflow="fold")
        tools.add_column("description", overflow="fold")
        for t in env.tools:
            props = t.parameters.get("properties", {})
            required = set(t.parameters.get("required", []))
            args = ", ".join(
                f"{k}{'' if k in required else '?'}: {v.get('type', 'any')}" for k, v in props.items()
            )
            tools.add_row(t.name, "yes" if t.terminal else "", args, t.description)
        console.print(tools)
    finally:
        env.close()
