"""CLI commands of web-shop: ``turngym web shop-build [--seed 0] [--size 12000]``."""

from __future__ import annotations

import typer


def webshop_build(
    seed: int = typer.Option(0, help="catalog seed"),
    size: int = typer.Option(12_000, help="number of products"),
) -> None:
    """Generate (or find in the cache) the web-shop catalog and print where it is."""
    import time

    from turngym.envs.webshop.catalog import Catalog, build_catalog

    t0 = time.perf_counter()
    path = build_catalog(seed, size)
    typer.echo(f"{path} ({len(Catalog(path))} products, {time.perf_counter() - t0:.1f} s)")
