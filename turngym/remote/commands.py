"""CLI: ``turngym serve ENV``."""

from __future__ import annotations

from typing import Annotated

import typer


def serve_command(
    envs: Annotated[
        list[str], typer.Argument(help="Env ids to serve (sessions name one; default: the first).")
    ],
    host: Annotated[
        str, typer.Option(help="Interface to listen on (0.0.0.0: every interface).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    max_sessions: Annotated[int, typer.Option(help="Most live sessions (envs); one more is refused.")] = 64,
    idle_timeout: Annotated[
        float, typer.Option(help="Seconds without a call before a session's env is closed (0: never).")
    ] = 600.0,
    mcp: Annotated[bool, typer.Option("--mcp", help="Also serve the env's tools over MCP at /mcp.")] = False,
    openenv: Annotated[
        bool, typer.Option("--openenv", help="Also speak OpenEnv's protocol at /openenv (openenv-core).")
    ] = False,
    env_arg: Annotated[
        list[str] | None, typer.Option("--env-arg", help="KEY=VALUE make() argument for every session.")
    ] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
) -> None:
    """Serve envs over HTTP and WebSocket (and OpenEnv, MCP) for RemoteEnv and other clients."""
    import uvicorn

    from turngym.cli_args import parse_key_values
    from turngym.remote.server import SessionManager, create_app

    manager = SessionManager(
        envs,
        max_sessions=max_sessions,
        idle_timeout=idle_timeout or None,
        env_kwargs=parse_key_values(env_arg),
    )
    app = create_app(manager, openenv=openenv, mcp=mcp, host=host)
    doors = ["/ws", "/sessions"] + (["/openenv"] if openenv else []) + (["/mcp"] if mcp else [])
    typer.echo(f"serving {', '.join(manager.envs)} at http://{host}:{port} ({', '.join(doors)})")
    uvicorn.run(app, host=host, port=port, log_level=log_level)
