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

    from turngym.envs.swe.synthesis import synthesize_all
    from turngym.envs.swe.tasks import DEFAULT_TASKS

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
    tasks: Path = typer.Option(
        None,
        help="Task file (SWE-bench JSON/JSONL) or Harbor task directory (default: the shipped task set).",
    ),
    limit: int = typer.Option(0, help="Only the first N tasks (0 = all)."),
    concurrency: int = typer.Option(2, help="Episodes at once."),
    snapshot: Path = typer.Option(
        None,
        help="Repository of plain SWE-bench instances: a git checkout (pinned to each base_commit), "
        "or a directory or tarball already at base_commit.",
    ),
    image: str = typer.Option(None, help="Image with the repository's dependencies (plain instances)."),
    src_root: str = typer.Option("", help="Import root inside the repository, e.g. src (plain instances)."),
    allow_unpinned: bool = typer.Option(
        False, help="Accept a snapshot that is not a git checkout although instances name a base_commit."
    ),
    empty: bool = typer.Option(
        True, help="Also check that an empty patch does not resolve any task (plain instances)."
    ),
    base_image: str = typer.Option(None, help="Base image to build task images on (default: turngym's)."),
) -> None:
    """Run the scripted expert on every task: each must be resolved (reward 1).

    On plain SWE-bench instances the expert applies each instance's gold patch, and an empty patch
    must not resolve the instance; on Harbor tasks it runs solution/solve.sh.
    """
    import asyncio

    from rich.console import Console

    from turngym.envs.swe.tasks import InstanceError
    from turngym.envs.swe.validate import run_expert

    console = Console()
    load = {
        "snapshot": str(snapshot) if snapshot else None,
        "image": image,
        "src_root": src_root,
        "allow_unpinned": allow_unpinned,
        "base_image": base_image,
    }
    try:
        results = asyncio.run(
            run_expert(tasks, limit=limit or None, concurrency=concurrency, check_empty=empty, **load)
        )
    except (InstanceError, FileNotFoundError, ImportError) as e:
        console.print(f"[red]{e}[/red]")
        raise typer.Exit(2) from None
    bad = {k: r for k, r in results.items() if r["gold"] != 1.0 or r.get("empty", 0.0) != 0.0}
    console.print(f"{len(results) - len(bad)}/{len(results)} tasks resolved by the expert")
    for k, r in bad.items():
        why = f"gold patch reward {r['gold']}" if r["gold"] != 1.0 else "an empty patch resolves it"
        console.print(f"  FAILED {k}: {why} {r.get('grade') or ''}")
    if bad:
        raise typer.Exit(1)


def swe_import_swebench(
    file: Path = typer.Argument(..., help="SWE-bench instances: a JSON list or object, or JSONL."),
    repo: Path = typer.Option(..., help="Local git checkout of the instances' repository (has base_commit)."),
    out: Path = typer.Option(None, help="Output task file (default: FILE with suffix .turngym.json)."),
    image: str = typer.Option(None, help="Image with the repository's dependencies (default: built)."),
    src_root: str = typer.Option("", help="Import root inside the repository, e.g. src."),
    test_requires: list[str] = typer.Option(None, help="pip requirements of the tests (image build)."),
    allow_unpinned: bool = typer.Option(
        False, help="Accept a repo that is not a git checkout although instances name a base_commit."
    ),
) -> None:
    """Check SWE-bench instances against a local checkout and write them as a swe-docker task file.

    Each instance's base_commit must be in the checkout (it is read from git, the checkout is not
    changed), its patch and test_patch must apply there; the output remembers the repository so
    `turngym swe validate --tasks OUT` and `turngym.make("swe-docker", tasks=OUT)` need nothing else.
    """
    from rich.console import Console

    from turngym.envs.swe.tasks import InstanceError, import_swebench, save_instances

    console = Console()
    extra = {"image": image, "src_root": src_root, "test_requires": tuple(test_requires or ())}
    try:
        tasks, problems = import_swebench(file, repo, allow_unpinned=allow_unpinned, **extra)
    except InstanceError as e:
        console.print(f"[red]{e}[/red]")
        raise typer.Exit(2) from None
    for p in problems:
        console.print(f"[red]{p}[/red]")
    if problems:
        console.print(f"{len(problems)} problem(s); nothing written")
        raise typer.Exit(1)
    dest = out or file.with_name(file.name.split(".")[0] + ".turngym.json")
    save_instances(tasks, dest)
    for t in tasks:
        at = t.graded_commit[:12] if t.graded_commit else "as given (unpinned)"
        console.print(
            f"  {t.instance_id}: base_commit {at}, {len(t.fail_to_pass)} FAIL_TO_PASS, "
            f"{len(t.pass_to_pass)} PASS_TO_PASS"
        )
    console.print(
        f"{len(tasks)} instance(s) written to {dest}; check them with: turngym swe validate --tasks {dest}"
    )


def sandbox_build(
    target: str = typer.Argument(
        "swe", help="What to build: swe (the base image and the swe-docker images) or desktop (gui-desktop)."
    ),
    base: str = typer.Option(None, help="Use this existing image as the base instead of building one."),
    mirror: str = typer.Option(None, help="Debian mirror (default: the one in the machine's apt config)."),
    packages: bool = typer.Option(True, help="Also build the images of the swe-docker packages."),
    force: bool = typer.Option(False, help="Rebuild even if an image with the same content hash exists."),
) -> None:
    """Build the Debian base image (debootstrap + docker import) and the swe-docker task images, and
    fetch the packages' pinned sdists into the cache (episodes then need no network); with ``desktop``,
    the base image and the gui-desktop image (Xvfb, openbox, AT-SPI and the desktop applications)."""
    from rich.console import Console

    from turngym.sandboxes.images import build_base_image

    console = Console()
    if base:
        console.print(f"base image: {base} (given)")
    else:
        report = build_base_image(mirror=mirror, force=force, log=lambda line: console.print(f"  {line}"))
        state = "cached" if report.cached else f"built in {report.seconds:.1f}s"
        console.print(f"base image: {report.tag} ({state})")
    if target == "desktop":
        from turngym.sandboxes.desktop_image import desktop_image

        desk = desktop_image(base, force=force)
        console.print(
            f"desktop image: {desk.tag} ({'cached' if desk.cached else f'built in {desk.seconds:.1f}s'})"
        )
        return
    if target != "swe":
        console.print(f"[red]unknown build target {target!r}: use swe or desktop[/red]")
        raise typer.Exit(2)
    if packages:
        from turngym.envs.swe.packages import PACKAGES, download_sdist, package_image

        for spec in PACKAGES.values():
            console.print(f"{spec.key}: {package_image(spec, base=base)}, sources {download_sdist(spec)}")
