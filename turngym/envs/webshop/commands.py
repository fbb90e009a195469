"""CLI commands of the web-site envs (wired into ``turngym`` by the lead): build data, serve a site.

turngym webshop-build [--seed 0] [--size 12000]
turngym web-site-serve shop|forum|tracker [--port 8080]
turngym webarena-tasks OUT.json [--seed 0] [--per-template 10]
"""

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


def web_site_serve(
    site: str = typer.Argument(..., help="shop, forum or tracker"),
    port: int = typer.Option(8080, help="port on 127.0.0.1"),
    seed: int = typer.Option(0, help="data seed"),
) -> None:
    """Serve one of the local sites for a person to browse (Ctrl-C stops it; state resets on restart)."""
    import time

    from turngym.envs.webarena.server import LocalServer
    from turngym.envs.webarena.sites import SITES, SiteInstance

    if site == "shop":
        from turngym.envs.webshop.app import ShopApp
        from turngym.envs.webshop.catalog import Catalog, build_catalog

        server = LocalServer(ShopApp(Catalog(build_catalog(seed))), name="shop", port=port).start()
    elif site in SITES:
        inst = SiteInstance(site, seed)
        inst.server.stop()
        server = LocalServer(inst.spec.app(inst.db.path), name=site, port=port).start()
    else:
        raise typer.BadParameter(f"unknown site {site!r}; choose shop, {', '.join(SITES)}")
    typer.echo(f"{site} on {server.url} (Ctrl-C to stop)")
    try:
        while server.alive:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


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
