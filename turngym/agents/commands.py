"""``turngym models``: the named pretrained models, and where each one is cached.

Text from outside (paths, error messages, install lines such as ``pip install 'turngym[models]'``) is
escaped before Rich prints it, so that brackets are shown rather than read as markup.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer


def models_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    prepare: Annotated[
        list[str] | None,
        typer.Option("--prepare", help="Convert this model now (repeatable); prints its folder."),
    ] = None,
    verify: Annotated[
        bool, typer.Option("--verify", help="With --prepare: re-hash every cached file.")
    ] = False,
) -> None:
    """List the pretrained models ``--model NAME`` accepts: parameters, source, cached path."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from turngym.agents.pretrained import (
        PretrainedModelError,
        cached_path,
        get_pretrained,
        pretrained_models,
        resolve_pretrained,
    )

    console = Console()
    for name in prepare or []:
        try:
            get_pretrained(name)
            folder = resolve_pretrained(
                name, verify=verify, log=lambda m: console.print(f"[dim]{escape(m)}[/dim]")
            )
        except PretrainedModelError as e:
            raise ValueError(str(e)) from None
        console.print(escape(f"{name}: {folder}"))
        problem = _template_problem(folder)
        if problem:
            console.print(
                f"[yellow]{escape(f'{name}: {problem}')}: multi-turn rollouts will be masked[/yellow]"
            )
    if prepare:
        return
    rows = []
    for m in pretrained_models():
        try:
            source, problem = str(m.source_file()), None
        except PretrainedModelError as e:
            source, problem = None, str(e)
        cached = cached_path(m.name) if source else None
        rows.append(
            {
                "name": m.name,
                "aliases": list(m.aliases),
                "params": m.params,
                "architecture": m.architecture,
                "description": m.description,
                "source": source,
                "cached": str(cached) if cached else None,
                "problem": problem,
                "template": m.template_notes,
            }
        )
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    table = Table(title="pretrained models (--model NAME)")
    for col in ("name", "params", "source", "cached"):
        table.add_column(col, overflow="fold")
    for r in rows:
        source = escape(r["source"]) if r["source"] else f"[red]{escape(r['problem'])}[/red]"
        cached = escape(r["cached"]) if r["cached"] else "[dim]not yet (converted on first use)[/dim]"
        table.add_row(escape(r["name"]), escape(r["params"]), source, cached)
    console.print(table)


def _template_problem(folder) -> str | None:
    from turngym.agents.chat import template_problem
    from turngym.agents.models import load_tokenizer

    try:
        tokenizer = load_tokenizer(folder)
    except Exception as e:  # noqa: BLE001 - a folder without a usable tokenizer: say so, go on
        return f"its tokenizer does not load ({type(e).__name__}: {str(e)[:160]})"
    return template_problem(tokenizer)
