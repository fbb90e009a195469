"""CLI commands of the browser families (typer command functions; heavy imports inside)."""

from __future__ import annotations

import typer


def miniwob_tasks(
    expert_only: bool = typer.Option(False, "--expert", help="Only the tasks the scripted experts solve."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List the 130 MiniWoB++ tasks: description, nondeterminism, and which scripted expert solves each."""
    import json

    from rich.console import Console
    from rich.table import Table

    from turngym.envs.web.expert import EXPERT_TASKS, GUI_EXPERT_TASKS
    from turngym.envs.web.tasks import all_tasks

    rows = [
        {
            "task": t.name,
            "dom_expert": t.name in EXPERT_TASKS,
            "pixel_expert": t.name in GUI_EXPERT_TASKS,
            "nondeterministic": t.nondeterministic,
            "partial_reward": t.partial_reward,
            "description": t.description,
        }
        for t in all_tasks().values()
        if not expert_only or t.name in EXPERT_TASKS
    ]
    if json_out:
        typer.echo(json.dumps(rows, indent=1))
        return
    table = Table("task", "DOM expert", "pixel expert", "nondet.", "description")
    for r in rows:
        mark = {True: "yes", False: ""}
        table.add_row(
            r["task"],
            mark[r["dom_expert"]],
            mark[r["pixel_expert"]],
            mark[r["nondeterministic"]],
            r["description"],
        )
    Console().print(table)


def browser_reap() -> None:
    """Kill Chromium processes that turngym launched for a process that no longer exists."""
    from turngym.sandboxes.browser import reap_orphan_browsers

    killed = reap_orphan_browsers()
    typer.echo(f"reaped {len(killed)} orphaned browser(s)" + (f": {killed}" if killed else ""))
