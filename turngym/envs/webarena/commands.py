"""CLI commands of web-arena-lite: ``turngym web arena-tasks OUT.json [--seed 0] [--per-template 10]``."""

from __future__ import annotations

import typer


def webarena_tasks(
    out: str = typer.Argument(..., help="where to write the tasks (WebArena JSON list)"),
    seed: int = typer.Option(0, help="data seed"),
    per_template: int = typer.Option(10, help="tasks per intent template (18 templates)"),
) -> None:
    """Write the generated arena-style tasks in WebArena's JSON format."""
    from turngym.envs.webarena.taskgen import generate_tasks
    from turngym.envs.webarena.tasks import save_tasks

    tasks = generate_tasks(seed, per_template)
    typer.echo(f"{len(tasks)} tasks -> {save_tasks(tasks, out)}")
