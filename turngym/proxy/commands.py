"""CLI: ``turngym proxy --model M [--out DIR] [--env ENV]``."""

from __future__ import annotations

from typing import Annotated

import typer

from turngym.proxy import TOKEN_ENV


def proxy_command(
    model: Annotated[
        str, typer.Option(help="Model: a turngym name (tiny, smollm2-135m), a path or a hub id.")
    ],
    out: Annotated[
        str | None, typer.Option(help="Directory for the episodes' trajectories (turngym view DIR).")
    ] = None,
    name: Annotated[str | None, typer.Option(help="The model name clients send (default: --model).")] = None,
    env: Annotated[
        list[str] | None,
        typer.Option(
            "--env", help="Also serve this env's tools over MCP per episode (/v1/episodes/{e}/mcp)."
        ),
    ] = None,
    env_arg: Annotated[
        list[str] | None, typer.Option("--env-arg", help="KEY=VALUE make() argument for the served env.")
    ] = None,
    kind: Annotated[str, typer.Option(help="Backend kind: hf, hf_worker or vllm.")] = "hf",
    url: Annotated[list[str] | None, typer.Option("--url", help="vLLM server URL (kind vllm).")] = None,
    parser: Annotated[
        str, typer.Option(help="Tool-call parser of the model's text: hermes or tags.")
    ] = "hermes",
    max_context: Annotated[int, typer.Option(help="Tokens per episode sequence (prompt + replies).")] = 4096,
    max_tokens: Annotated[int, typer.Option(help="Default max_tokens of a call that sets none.")] = 512,
    reward_timeout: Annotated[
        float, typer.Option(help="Seconds after an episode ends for its reward to come before it is masked.")
    ] = 60.0,
    idle_timeout: Annotated[
        float, typer.Option(help="Seconds without a call before an episode ends.")
    ] = 600.0,
    host: Annotated[str, typer.Option(help="Interface to listen on (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8100,
    token: Annotated[
        str | None,
        typer.Option(
            help=f"The secret clients send as their OpenAI API key; default ${TOKEN_ENV}, else a random one, printed."
        ),
    ] = None,
    insecure_no_token: Annotated[
        bool, typer.Option("--insecure-no-token", help="Serve without a token (loopback binds only).")
    ] = False,
    allow_host: Annotated[
        list[str] | None,
        typer.Option("--allow-host", help="Another Host header to answer (NAME or NAME:PORT)."),
    ] = None,
) -> None:
    """Serve a model as an OpenAI-compatible API and record every call as token-exact episodes."""
    import os
    import threading

    from turngym.cli_args import parse_key_values
    from turngym.proxy.api import make_proxy, serve_proxy
    from turngym.remote.http_protocols import parser_line
    from turngym.remote.security import resolve_token

    # refuse an unsafe bind before loading the model
    resolve_token(token, env_var=TOKEN_ENV, insecure_no_token=insecure_no_token, host=host)

    spec = {"kind": kind, "urls": list(url or [])} if kind != "hf" else {}
    proxy = make_proxy(
        model,
        name=name or model,
        out=out,
        parser=parser,
        max_context=max_context,
        max_tokens=max_tokens,
        reward_timeout_s=reward_timeout,
        idle_timeout_s=idle_timeout,
        env_id=(env or ["proxy"])[0],
        **spec,
    )
    with serve_proxy(
        proxy,
        host=host,
        port=port,
        token=token,
        insecure_no_token=insecure_no_token,
        envs=list(env or []) or None,
        env_kwargs=parse_key_values(env_arg),
        extra_hosts=list(allow_host or []),
    ) as running:
        typer.echo(
            f"model {proxy.model.name!r} at {running.base_url()} (per episode: {running.url}/v1/episodes/<key>)"
        )
        if env:
            typer.echo(f"env tools over MCP at {running.url}/v1/episodes/<key>/mcp")
        if running.token and not token and not os.environ.get(TOKEN_ENV):
            typer.echo(f"token (the OpenAI API key): {running.token}")
        if out:
            typer.echo(f"trajectories: {out}/trajectories.jsonl")
        typer.echo(parser_line(running.server.http_parser))
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            typer.echo("stopping")
