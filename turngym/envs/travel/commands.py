"""CLI commands of the travel family (typer-annotated; heavy imports stay inside the bodies).

* ``travel-build-db``: generate (or rebuild) the sandbox database into the cache.
* ``travel-sample``: write generated queries in TravelPlanner's JSONL format (with the sampled plans).
* ``travel-eval``: score a TravelPlanner-format plan file against a query file (the published metrics).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer


def travel_build_db(
    seed: Annotated[int, typer.Option(help="database seed")] = 0,
    n_cities: Annotated[int | None, typer.Option(help="number of cities (default: all 304)")] = None,
    n_days: Annotated[int, typer.Option(help="days of flight data from 2022-03-01")] = 31,
    cache_dir: Annotated[
        Path | None, typer.Option(help="cache root (default $TURNGYM_CACHE_DIR or ~/.cache/turngym)")
    ] = None,
    force: Annotated[bool, typer.Option(help="rebuild even if cached")] = False,
) -> None:
    """Generate the travel sandbox database (parquet) and print where it is."""
    from turngym.envs.travel.database import build_database

    path = build_database(seed, n_cities, n_days, cache_dir=cache_dir, force=force)
    meta = json.loads((path / "meta.json").read_text())
    typer.echo(json.dumps({"path": str(path), **meta}, indent=2))


def travel_sample(
    out: Annotated[Path, typer.Argument(help="output JSONL file")],
    n: Annotated[int, typer.Option(help="number of queries")] = 100,
    level: Annotated[
        str | None, typer.Option(help="easy, medium or hard (default: cycle through all)")
    ] = None,
    seed: Annotated[int, typer.Option(help="sampling seed")] = 0,
    db_seed: Annotated[int, typer.Option(help="database seed")] = 0,
    db_path: Annotated[
        Path | None, typer.Option(help="a database folder instead of the generated one")
    ] = None,
) -> None:
    """Write generated queries (TravelPlanner's query format plus ``annotated_plan``) to a JSONL file."""
    import numpy as np

    from turngym.envs.travel.database import get_database
    from turngym.envs.travel.queries import LEVELS, sample_task

    db = get_database(db_seed, path=db_path)
    rng = np.random.default_rng(seed)
    with out.open("w", encoding="utf-8") as f:
        for i in range(n):
            task = sample_task(db, rng, level=level or LEVELS[i % len(LEVELS)])
            row = task.query.to_travelplanner()
            row["annotated_plan"] = [d.unit() for d in task.plan]
            f.write(json.dumps(row) + "\n")
    typer.echo(f"wrote {n} queries to {out}")


def travel_eval(
    queries: Annotated[
        Path, typer.Argument(help="TravelPlanner queries: JSONL, a JSON list or object, or CSV")
    ],
    plans: Annotated[
        Path, typer.Argument(help='JSONL, one {"plan": [...]} per query line (null = not delivered)')
    ],
    db_seed: Annotated[int, typer.Option(help="database seed")] = 0,
    db_path: Annotated[
        Path | None, typer.Option(help="TravelPlanner database folder or a parquet folder")
    ] = None,
    lenient: Annotated[
        bool, typer.Option(help="the published evaluator's semantics (see evaluate.py)")
    ] = False,
) -> None:
    """Score plans with the 8 commonsense + 5 hard checks and print TravelPlanner's metrics as JSON."""
    from turngym.envs.travel.database import get_database
    from turngym.envs.travel.evaluate import aggregate_metrics, evaluate_plan
    from turngym.envs.travel.models import PlanError, load_queries, parse_plan

    try:
        qs = load_queries(queries)
    except (OSError, ValueError) as e:
        raise typer.BadParameter(str(e), param_hint="QUERIES") from None
    lines = [ln for ln in plans.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if len(lines) != len(qs):
        raise typer.BadParameter(f"{plans} has {len(lines)} plans for {len(qs)} queries")
    db = get_database(db_seed, path=db_path)
    results = []
    for n, (q, line) in enumerate(zip(qs, lines, strict=True), 1):
        row = json.loads(line)
        raw = row.get("plan") if isinstance(row, dict) else row
        try:
            plan = parse_plan(raw) if raw else None
        except PlanError as e:
            typer.echo(f"{plans}:{n}: {e}; counted as not delivered", err=True)
            plan = None
        results.append((q, evaluate_plan(q, plan, db, strict=not lenient)))
    typer.echo(json.dumps(aggregate_metrics(results), indent=2))
