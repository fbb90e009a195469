"""CLI: ``turngym serve ENV``."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

TOKEN_ENV = "TURNGYM_SERVE_TOKEN"
TRAINER_TOKEN_ENV = "TURNGYM_SERVE_TRAINER_TOKEN"
AUTH_HINT = (
    "send the header 'Authorization: Bearer <token>' with the token `turngym serve` printed at start "
    f"(RemoteEnv reads it from ${TOKEN_ENV}, or token=...)"
)


def serve_command(
    envs: Annotated[
        list[str], typer.Argument(help="Env ids to serve (sessions name one; default: the first).")
    ],
    host: Annotated[
        str,
        typer.Option(
            help="Interface to listen on (0.0.0.0: every interface; the token is then the only gate)."
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    token: Annotated[
        str | None,
        typer.Option(
            help=f"The secret clients must send (Authorization: Bearer); default ${TOKEN_ENV}, else a random "
            "one, printed at start."
        ),
    ] = None,
    trainer_token: Annotated[
        str | None,
        typer.Option(
            help=f"A second secret (default ${TRAINER_TOKEN_ENV}): its holders are trainers and also get "
            "privileged info (the gold reference) and the expert's actions."
        ),
    ] = None,
    insecure_no_token: Annotated[
        bool,
        typer.Option(
            "--insecure-no-token",
            help="Serve without a token (loopback binds only): any local process may connect.",
        ),
    ] = False,
    max_sessions: Annotated[int, typer.Option(help="Most live sessions (envs); one more is refused.")] = 64,
    idle_timeout: Annotated[
        float, typer.Option(help="Seconds without a call before a session's env is closed (0: never).")
    ] = 600.0,
    mcp: Annotated[bool, typer.Option("--mcp", help="Also serve the env's tools over MCP at /mcp.")] = False,
    openenv: Annotated[
        bool, typer.Option("--openenv", help="Also speak OpenEnv's protocol at /openenv (openenv-core).")
    ] = False,
    env_arg: Annotated[
        list[str] | None,
        typer.Option(
            "--env-arg",
            help="KEY=VALUE make() argument for every session (ENV:KEY=VALUE: for one env); always wins.",
        ),
    ] = None,
    client_arg: Annotated[
        list[str] | None,
        typer.Option(
            "--client-arg",
            help="A make() argument clients may set (NAME, or ENV:NAME for one env); never a command, path, "
            "URL, image or limit.",
        ),
    ] = None,
    allow_host: Annotated[
        list[str] | None,
        typer.Option("--allow-host", help="Another Host header to answer (NAME or NAME:PORT)."),
    ] = None,
    allow_origin: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-origin", help="A web origin allowed to call (scheme://host:port); none by default."
        ),
    ] = None,
    max_connections: Annotated[
        int | None,
        typer.Option(help="Most open connections (default: half the file-descriptor limit, <= 1000)."),
    ] = None,
    header_timeout: Annotated[
        float, typer.Option(help="Seconds a connection may take to send a request's headers.")
    ] = 10.0,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
) -> None:
    """Serve envs over HTTP and WebSocket (and OpenEnv, MCP) for RemoteEnv and other clients."""
    import uvicorn

    from turngym.cli_args import CLIError, err_console
    from turngym.remote.http_protocols import parser_line
    from turngym.remote.security import ServeGuard, resolve_token, uvicorn_limits
    from turngym.remote.server import SessionManager, create_app

    try:
        secret, generated = resolve_token(
            token, env_var=TOKEN_ENV, insecure_no_token=insecure_no_token, host=host
        )
        trainer = trainer_token or os.environ.get(TRAINER_TOKEN_ENV) or None  # none: nobody is a trainer
        fixed, per_env = split_env_args(env_arg)
        manager = SessionManager(
            envs,
            max_sessions=max_sessions,
            idle_timeout=idle_timeout or None,
            env_kwargs=fixed,
            env_kwargs_for=per_env,
            client_args=split_client_args(client_arg),
        )
        guard = ServeGuard.for_bind(
            host,
            port,
            secret,
            trainer_token=trainer,
            extra_hosts=allow_host or (),
            allowed_origins=allow_origin or (),
            auth_hint=AUTH_HINT,
        )
        limits = uvicorn_limits(max_connections=max_connections, header_timeout=header_timeout)
    except ValueError as e:
        raise CLIError(str(e)) from None
    app = create_app(manager, guard=guard, openenv=openenv, mcp=mcp)
    doors = ["/ws", "/sessions"] + (["/openenv"] if openenv else []) + (["/mcp"] if mcp else [])
    typer.echo(f"serving {', '.join(manager.envs)} at http://{host}:{port} ({', '.join(doors)})")
    typer.echo(parser_line(limits["http"].http_parser))
    if secret is None:
        err_console.print(
            "[bold red]WARNING[/]: --insecure-no-token: any process on this machine can drive these envs "
            "(web pages are still refused by the Host and Origin checks)"
        )
    elif generated:
        typer.echo(f"token (generated; choose one with --token or ${TOKEN_ENV}): {secret}")
    if secret is not None:
        typer.echo(f"clients send 'Authorization: Bearer <token>'; RemoteEnv reads ${TOKEN_ENV}")
    if trainer is not None:
        typer.echo(
            f"trainer token set: its holders also get privileged info (RemoteEnv reads ${TRAINER_TOKEN_ENV})"
        )
    uvicorn.run(app, host=host, port=port, log_level=log_level, **limits)


def split_env_args(items: list[str] | None) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``--env-arg`` values: ``KEY=VALUE`` for every env, ``ENV:KEY=VALUE`` for one."""
    from turngym.cli_args import parse_key_values

    shared: list[str] = []
    scoped: dict[str, list[str]] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        env, colon, name = key.partition(":")
        if sep and colon:
            scoped.setdefault(env.strip(), []).append(f"{name}={value}")
        else:
            shared.append(item)
    return parse_key_values(shared), {env: parse_key_values(v) for env, v in scoped.items()}


def split_client_args(items: list[str] | None) -> dict[str, list[str]]:
    """``--client-arg`` values: ``NAME`` for every env (key ``"*"``), ``ENV:NAME`` for one."""
    out: dict[str, list[str]] = {}
    for item in items or []:
        env, colon, name = item.partition(":")
        env, name = (env.strip(), name.strip()) if colon else ("*", env.strip())
        if not name:
            raise ValueError(f"--client-arg needs NAME or ENV:NAME, got {item!r}")
        out.setdefault(env, []).append(name)
    return out
