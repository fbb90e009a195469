"""``turngym swe ...``: synthesise and check swe-docker tasks; ``turngym sandbox build``: the base
image and the swe-docker package images (typer command functions). The build lives here, not in
``turngym.sandboxes``, because it drives both layers: sandboxes sit below the envs."""

from __future__ import annotations

from pathlib import Path

import typer


def swe_synth(
    out: Path = typer.Option(None, help="Output JSON (SWE-bench instances); default: the shipped task set."),
    package: list[str] = typer.Option(None, help="Package(s) to use (default: all known)."),
    max_tasks: int = typer.Option(25, help="Validated tasks to keep per package."),
    max_candidates: int = typer.Option(70, help="Mutations to try per package."),
    seed: int = typer.Option(0, help="Seed of the candidate order."),
    base: str = typer.Option(None, help="Existing base image to use instead of the debootstrap one."),
) -> None:
    """Synthesise validated bug-fix tasks from real PyPI packages (runs their test suites in Docker)."""
    from rich.console import Console

    from turngym.envs.swe.tasks import DEFAULT_TASKS, synthesize_all

    console = Console()
    tasks = synthesize_all(
        package or None,
        out=out,
        max_tasks=max_tasks,
        max_candidates=max_candidates,
        seed=seed,
        base=base,
        log=console.print,
    )
    console.print(f"{len(tasks)} tasks written to {out or DEFAULT_TASKS}")


def swe_validate(
    tasks: Path = typer.Option(None, help="Task file (default: the shipped task set)."),
    limit: int = typer.Option(0, help="Only the first N tasks (0 = all)."),
    concurrency: int = typer.Option(2, help="Episodes at once."),
    snapshot: Path = typer.Option(
        None,
        help="Repository of plain SWE-bench instances: a git checkout (pinned to each base_commit), "
        "or a directory or tarball already at base_commit.",
    ),
    image: str = typer.Option(None, help="Image with the repository's dependencies (plain instances)."),
    src_root: str = typer.Option("", help="Import root inside the repository, e.g. src (plain instances)."),
) -> None:
    """Run the scripted expert on every task: each must be resolved (reward 1).

    On plain SWE-bench instances the expert applies each instance's gold patch.
    """
    import asyncio

    from rich.console import Console

    from turngym.envs.swe.validate import run_expert

    console = Console()
    load = {"snapshot": str(snapshot) if snapshot else None, "image": image, "src_root": src_root}
    results = asyncio.run(run_expert(tasks, limit=limit or None, concurrency=concurrency, **load))
    bad = {k: v for k, v in results.items() if v != 1.0}
    console.print(f"{len(results) - len(bad)}/{len(results)} tasks resolved by the expert")
    for k, v in bad.items():
        console.print(f"  FAILED {k}: reward {v}")
    if bad:
        raise typer.Exit(1)


def sandbox_build(
    base: str = typer.Option(None, help="Use this existing image as the base instead of building one."),
    mirror: str = typer.Option(None, help="Debian mirror (default: the one in the machine's apt config)."),
    packages: bool = typer.Option(True, help="Also build the images of the swe-docker packages."),
    force: bool = typer.Option(False, help="Rebuild even if an image with the same content hash exists."),
) -> None:
    """Build the Debian base image (debootstrap + docker import) and the swe-docker task images."""
    from rich.console import Console

    from turngym.sandboxes.images import build_base_image

    console = Console()
    if base:
        console.print(f"base image: {base} (given)")
    else:
        report = build_base_image(mirror=mirror, force=force, log=lambda line: console.print(f"  {line}"))
        state = "cached" if report.cached else f"built in {report.seconds:.1f}s"
        console.print(f"base image: {report.tag} ({state})")
    if packages:
        from turngym.envs.swe.packages import PACKAGES, package_image

        for spec in PACKAGES.values():
            console.print(f"{spec.key}: {package_image(spec, base=base)}")
