"""CLI: ``turngym new``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def new_command(
    name: Annotated[str, typer.Argument(help="Env name, lowercase with dashes (e.g. 'my-env').")],
    directory: Annotated[Path | None, typer.Option("--dir", help="Where to write (default ./NAME).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Write into a non-empty directory.")] = False,
) -> None:
    """Scaffold an installable env package (entry point, env module, tests, README)."""
    from turngym.sdk.scaffold import names_for, scaffold

    root = scaffold(name, directory, force=force)
    n = names_for(name)
    typer.echo(f"created {root} (package {n['pkg']}, env {name}-v0)")
    typer.echo(f"next: pip install -e {root} && turngym check {name} && python -m pytest {root}/tests")
