"""CLI: ``turngym view``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def view_command(
    run: Annotated[Path, typer.Argument(help="Run directory, or a trajectories .jsonl/.parquet file.")],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Output HTML (default RUN/report.html).")
    ] = None,
) -> None:
    """Write a self-contained HTML report of a run's trajectories."""
    from turngym.viewer.report import write_report

    path = write_report(run, out)
    typer.echo(f"wrote {path}")
