"""CLI: ``turngym new`` (scaffold an env package) and ``turngym check`` (the conformance suite)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from turngym.cli_args import KwOption, console, parse_key_values


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


def check_command(
    targets: Annotated[
        list[str] | None,
        typer.Argument(
            help="Env ids, or paths of Python files/packages defining envs (default: all registered)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    kw: KwOption = None,
    skip_extra: Annotated[
        list[str] | None,
        typer.Option(
            "--skip-extra", help="With no targets: leave out the envs that need this extra (repeat)."
        ),
    ] = None,
) -> None:
    """Run the conformance suite on environments; exit code 1 if any check fails."""
    from turngym.core.registry import registry
    from turngym.sdk.check_path import load_envs_from_path
    from turngym.testing import check_env

    envs: list[Any] = []
    if targets:
        for target in targets:
            envs.extend(load_envs_from_path(target) if Path(target).exists() else [target])
    else:  # every registered env that can be made without arguments; the others are named
        for s in registry.latest():
            missing = required_arguments(s)
            skipped = sorted(set(skip_extra or []) & set(s.requires))
            if skipped:
                console.print(f"[yellow]{s.id}: skipped (--skip-extra {', '.join(skipped)})")
            elif missing:
                console.print(
                    f"[yellow]{s.id}: skipped, needs {', '.join(missing)} (check it by name with --env-arg)"
                )
            else:
                envs.append(s.id)
    reports = [check_env(e, **(parse_key_values(kw or []) if isinstance(e, str) else {})) for e in envs]
    if as_json:
        print(json.dumps([r.to_dict() for r in reports], indent=2))
    else:
        for r in reports:
            table = Table(title=f"{r.env_id}: {'PASS' if r.ok else 'FAIL'}", title_justify="left")
            table.add_column("check")
            table.add_column("result")
            table.add_column("detail", overflow="fold")
            for c in r.results:
                table.add_row(
                    c.name, "[green]ok[/green]" if c.passed else "[red]FAIL[/red]", c.detail.strip()[:800]
                )
            console.print(table)
    failed = [(r.env_id, c) for r in reports for c in r.failures]
    for env_id, c in failed:  # last, on stderr: a long run's tail names what failed
        first = (c.detail.strip().splitlines() or [""])[0]
        typer.echo(f"FAIL {env_id} {c.name}: {first[:300]}", err=True)
    if failed:
        raise typer.Exit(1)


def required_arguments(spec: Any) -> list[str]:
    """The constructor arguments an env needs that its registration does not give (e.g. ``url`` of
    ``remote-v0``); [] when its entry point cannot be inspected."""
    import inspect

    try:
        init = inspect.signature(spec.load())
    except Exception:  # noqa: BLE001 - an entry point that does not load is check_env's to report
        return []
    return [
        name
        for name, p in init.parameters.items()
        if p.default is inspect.Parameter.empty
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and name not in spec.kwargs
    ]
