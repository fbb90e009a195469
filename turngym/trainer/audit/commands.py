"""CLI command ``turngym credit audit`` (a typer function; wired in ``turngym/cli.py``).

    turngym credit audit search-qa -b hf --model tiny -n 8 -g 4 --k 8 --out runs/audit
    turngym credit audit arith -b random -n 4 -g 4 --k 4 --turns tool --budget 20000 --out runs/a

``-n`` tasks of ``-g`` samples each: n x g trajectories. Writes ``audit.json``, ``audit.md`` and
``trajectories.jsonl`` to ``--out`` (``turngym view DIR`` shows A* per turn and the audit's plots)
and prints the table. With an ``hf`` backend the policy's weights are loaded once more for the
methods that score with them (IGPO); other backends run IGPO without a scorer (reported).
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Annotated, Any

import typer

from turngym.cli_args import parse_key_values
from turngym.rollout.cli_options import RunOptions, with_options
from turngym.rollout.commands import EnvArg

MethodOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--method",
        help="A credit method to score, NAME or NAME:key=value,... (repeat; 'all': every registered "
        "method; default: grpo, the igpo variants, gigpo, turn, tree, tree_gigpo, vine).",
    ),
]


@with_options(RunOptions, after=2, backend="hf", n=8, g=4, max_tokens=128)
def audit_command(
    env: EnvArg,
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory.")],
    k: Annotated[int, typer.Option("--k", help="Continuations per state for A* (>= 2).")] = 8,
    vine_k: Annotated[
        int, typer.Option("--vine-k", help="Further continuations per state for the vine method.")
    ] = 2,
    turns: Annotated[
        str, typer.Option("--turns", help="Which turns to audit: all, tool (tool-call turns) or sample.")
    ] = "all",
    sample_turns: Annotated[
        int, typer.Option("--sample-turns", help="--turns sample: how many turn indices to draw.")
    ] = 2,
    max_turns: Annotated[
        int | None, typer.Option("--max-turns", help="Tighten the env's turn limit.")
    ] = None,
    budget: Annotated[
        int | None,
        typer.Option("--budget", help="Continuation tokens at most; forks stop when spent (reported)."),
    ] = None,
    method: MethodOpt = None,
    success_threshold: Annotated[
        float, typer.Option("--success-threshold", help="An episode succeeded when its outcome >= this.")
    ] = 0.5,
    bootstrap: Annotated[int, typer.Option("--bootstrap", help="Bootstrap resamples for error bars.")] = 200,
    *,
    run: RunOptions,
) -> None:
    """Ground-truth turn advantages A* from forked envs, and every credit method scored against them."""
    from turngym.agents.factory import NEEDS_MODEL, agent_kinds
    from turngym.core.env import NotForkable
    from turngym.trainer.audit import DEFAULT_METHODS, AuditConfig, markdown_table, write_audit

    if run.backend not in agent_kinds():
        raise typer.BadParameter(f"--backend must be one of {', '.join(agent_kinds())}")
    if run.backend in NEEDS_MODEL and not run.model:
        raise typer.BadParameter(f"--backend {run.backend} needs --model")
    try:
        cfg = AuditConfig(
            env=env,
            env_kwargs=parse_key_values(run.env_arg),
            n=run.n * run.g,
            group_size=run.g,
            k=k,
            vine_k=vine_k,
            turns=turns,
            sample_turns=sample_turns,
            budget=budget,
            methods=tuple(method) if method else DEFAULT_METHODS,
            success_threshold=success_threshold,
            bootstrap=bootstrap,
            seed=run.seed,
            max_turns=max_turns,
            max_concurrency=run.concurrency,
        )
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    try:
        result = asyncio.run(_audit(cfg, run))
    except NotForkable as e:
        raise typer.BadParameter(str(e), param_hint="ENV") from e
    write_audit(out, result.report, result.trajectories)
    typer.echo(markdown_table(result.report))
    typer.echo(f"wrote {out}/audit.json, audit.md, trajectories.jsonl")


async def _audit(cfg: Any, run: dict[str, Any]) -> Any:
    from turngym.agents.factory import make_agent
    from turngym.trainer.audit import run_audit

    context: dict[str, Any] = {"parser": _parser(cfg.env, cfg.env_kwargs)}
    if run.backend in ("hf", "hf_worker") and any(m.startswith("igpo") for m in cfg.methods):
        from turngym.agents.models import load_model, load_tokenizer

        context["model"] = load_model(run.model)
        context["tokenizer"] = load_tokenizer(run.model)
    async with AsyncExitStack() as stack:
        agent = await make_agent(run.agent_spec(), stack)
        return await run_audit(agent, cfg, **context)


def _parser(env: str, env_kwargs: dict[str, Any]) -> Any:
    """The env's tool-call parser (how IGPO frames the answer), as the trainer finds it."""
    from turngym.core.registry import UnknownEnvError, spec
    from turngym.tools.parsers import get_parser

    try:
        name = spec(env).parser(env_kwargs)
    except UnknownEnvError:
        name = env_kwargs.get("parser", "hermes")
    return get_parser(name)
