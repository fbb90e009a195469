"""``turngym sandbox ...``: list and prune containers (typer command functions; ``sandbox build``
lives in ``turngym.envs.swe.commands``, as it builds the swe-docker images too).

Heavy imports live inside the functions so that ``turngym --help`` stays light.
"""

from __future__ import annotations

import typer


def sandbox_ls(
    all_runs: bool = typer.Option(True, "--all/--mine", help="All turngym containers, or only this host's."),
) -> None:
    """List turngym containers with their owner process, run id and whether the owner is alive."""
    import socket

    from rich.console import Console
    from rich.table import Table

    from turngym.sandboxes.docker import (
        LABEL_HOST,
        LABEL_IMAGE,
        LABEL_PID,
        LABEL_RUN_ID,
        managed_containers,
        owner_alive,
    )

    table = Table()
    for column in ("name", "status", "image", "owner pid", "run id", "owner alive"):
        table.add_column(column, no_wrap=True)
    for c in managed_containers():
        labels = c.labels
        if not all_runs and labels.get(LABEL_HOST) != socket.gethostname():
            continue
        table.add_row(
            c.name,
            c.status,
            labels.get(LABEL_IMAGE, ""),
            labels.get(LABEL_PID, ""),
            labels.get(LABEL_RUN_ID, ""),
            "yes" if owner_alive(labels) else "no (orphan)",
        )
    Console(width=200).print(table)


def sandbox_prune(
    run_id: str = typer.Option(None, help="Only containers of this run id."),
    everything: bool = typer.Option(False, "--all", help="Also containers whose owner is still alive."),
    images: bool = typer.Option(
        False, help="Also remove turngym images no container uses (forces rebuilds)."
    ),
) -> None:
    """Remove orphaned turngym containers (owner process gone), or all of them with --all."""
    from rich.console import Console

    from turngym.sandboxes.docker import LABEL_MANAGED, docker_client, reap_orphans

    console = Console()
    removed = reap_orphans(run_id=run_id, everything=everything)
    console.print(f"removed {len(removed)} container(s)" + (f": {', '.join(removed)}" if removed else ""))
    if images:
        import docker.errors

        client = docker_client()
        gone = 0
        for image in client.images.list(filters={"label": f"{LABEL_MANAGED}=1"}):
            try:
                client.images.remove(image.id, force=False)
                gone += 1
            except docker.errors.APIError:
                pass  # in use, or a parent of another image
        console.print(f"removed {gone} image(s)")
