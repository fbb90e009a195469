"""CLI command of the local sites: ``turngym web serve SITE [--port 8080] [--seed 0]``."""

from __future__ import annotations

import typer


def web_site_serve(
    site: str = typer.Argument(..., help="a registered site: shop, forum, tracker, ..."),
    port: int = typer.Option(8080, help="port on 127.0.0.1"),
    seed: int = typer.Option(0, help="data seed"),
) -> None:
    """Serve one of the local sites for a person to browse (Ctrl-C stops it; state resets on restart)."""
    import time

    from turngym.envs.browser.sites import site_names, start_site

    if site not in site_names():
        raise typer.BadParameter(f"unknown site {site!r}; choose {', '.join(site_names())}")
    server = start_site(site, seed=seed, port=port)
    typer.echo(f"{site} on {server.url} (Ctrl-C to stop)")
    try:
        while server.alive:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
