"""CLI commands ``turngym rollout`` and ``turngym eval`` (typer functions; wired in ``turngym/cli.py``).

    turngym rollout arith --backend hf --model tiny -n 8 -g 4 --out runs/arith
    turngym rollout arith --backend vllm --model /ckpt --url http://127.0.0.1:8000 -n 64 -g 8 --out runs/x
    turngym eval arith --backend scripted -n 100
    turngym rollout search-qa --backend hf --model tiny -n 4 --tree --tree-k 2 --tree-turns 0,2 --out runs/tree

Backends: ``vllm`` (``--url`` servers, or a local server started for ``--model``), ``hf``
(transformers in-process), ``openai`` (chat API with native tools; ``--base-url``), ``scripted``
(the env's expert), ``random``. ``--model tiny`` builds a tiny random model. Both commands show a
progress bar (trajectories, turns, tokens/s, errors) and write ``trajectories.jsonl`` +
``trajectories.parquet`` (+ ``stats.json``; ``eval.json`` for eval) to ``--out``. ``rollout --tree``
grows a tree per task instead of ``-g`` samples (``turngym.rollout.tree``): every root-to-leaf path is
a trajectory, and ``turngym view`` draws the tree.
Heavy imports happen inside the functions.
"""

from __future__ import annotations

import asyncio
import json
import math
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Annotated, Any

import typer

from turngym.cli_args import parse_key_values
from turngym.rollout.cli_options import RunOptions, TreeOptions, use_hf_worker, with_options

__all__ = ["RunOptions", "TreeOptions", "eval", "rollout", "summarize", "use_hf_worker", "wilson_interval"]

EnvArg = Annotated[str, typer.Argument(help="Environment id (see `turngym envs`).")]


@with_options(RunOptions, TreeOptions, after=2)
def rollout(
    env: EnvArg,
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory.")],
    *,
    run: RunOptions,
    tree: TreeOptions,
) -> None:
    """Generate trajectories and save them as JSONL and parquet (--tree: a tree per task)."""
    stats, _ = _run(env, run, out=out, tree=tree.config())
    typer.echo(json.dumps(stats, indent=2))


@with_options(RunOptions, after=1, n=32, temperature=0.0)
def eval(  # noqa: A001 - the command is called eval
    env: EnvArg,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Also save trajectories and eval.json.")
    ] = None,
    threshold: Annotated[float, typer.Option("--threshold", help="Success: outcome reward >= this.")] = 1.0,
    *,
    run: RunOptions,
) -> None:
    """Success rate (Wilson 95% interval) and mean reward (95% interval) of an agent on an env."""
    from rich.console import Console
    from rich.table import Table

    stats, trajectories = _run(env, run, out=out)
    report = summarize(trajectories, threshold)
    report["stats"] = stats
    backend, model = run.backend, run.model
    table = Table(title=f"{env} — {backend}{' ' + model if model else ''}")
    for col in ("episodes", "success", "95% CI", "mean reward (unmasked)", "95% CI ", "masked"):
        table.add_column(col)
    lo, hi = report["success_ci"]
    rlo, rhi = report["reward_ci"]
    table.add_row(
        str(report["episodes"]),
        f"{report['success_rate']:.3f}",
        f"[{lo:.3f}, {hi:.3f}]",
        f"{report['mean_reward']:.3f}",
        f"[{rlo:.3f}, {rhi:.3f}]",
        f"{report['masked']} ({report['masked_frac']:.0%})",
    )
    Console().print(table)
    if out is not None:
        (Path(out) / "eval.json").write_text(json.dumps(report, indent=2))


def summarize(trajectories: list[Any], threshold: float = 1.0) -> dict[str, Any]:
    """Success rate with a Wilson interval and mean reward with a normal interval.

    A masked trajectory (the rollout failed: crash, timeout, token mismatch) counts as a failure in
    the success rate, whose denominator is every episode; the mean reward is over unmasked episodes
    only and is reported beside the masked count and fraction, never without them.
    """
    valid = [t for t in trajectories if not t.masked]
    k = sum(t.outcome >= threshold for t in valid)
    n = len(trajectories)
    rewards = [t.total_reward for t in valid]
    mean = sum(rewards) / len(rewards) if rewards else 0.0
    var = sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1) if len(rewards) > 1 else 0.0
    half = 1.96 * math.sqrt(var / len(rewards)) if rewards else 0.0
    return {
        "episodes": n,
        "masked": n - len(valid),
        "masked_frac": (n - len(valid)) / n if n else 0.0,
        "successes": k,
        "success_rate": k / n if n else 0.0,
        "success_ci": list(wilson_interval(k, n)),
        "mean_reward": mean,
        "reward_ci": [mean - half, mean + half],
        "mean_turns": sum(t.num_turns for t in valid) / len(valid) if valid else 0.0,
    }


def wilson_interval(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if k == 0 else max(0.0, center - half)
    hi = 1.0 if k == n else min(1.0, center + half)
    return (lo, hi)


def _run(
    env: str, run: RunOptions, *, out: Path | None = None, tree: Any = None
) -> tuple[dict[str, Any], list[Any]]:
    from turngym.agents.factory import NEEDS_MODEL, agent_kinds

    if run.backend not in agent_kinds():  # the built-in kinds and any registered with @agent_kind
        raise typer.BadParameter(f"--backend must be one of {', '.join(agent_kinds())}")
    if run.backend in NEEDS_MODEL and not run.model:
        raise typer.BadParameter(f"--backend {run.backend} needs --model")
    from turngym.core.env import NotForkable
    from turngym.rollout.tree import TreeError

    try:
        return asyncio.run(_run_async(env, run, out, tree))
    except NotForkable as e:  # --tree on an env that cannot fork: said before any episode ran
        raise typer.BadParameter(str(e), param_hint="--tree") from e
    except TreeError as e:  # a tree that cannot grow as configured (k above the env's max_live, ...)
        raise typer.BadParameter(str(e), param_hint="--tree") from e


async def _run_async(
    env: str, run: RunOptions, out: Path | None, tree: Any
) -> tuple[dict[str, Any], list[Any]]:
    from turngym.agents.factory import make_agent
    from turngym.rollout.engine import RolloutConfig, RolloutEngine
    from turngym.rollout.store import TrajectoryWriter

    env_kwargs = parse_key_values(run.env_arg)
    if run.backend == "openai":
        env_kwargs.setdefault("tools_in_prompt", False)
    config = RolloutConfig(
        group_size=run.g,
        max_concurrency=run.concurrency,
        turn_timeout=run.turn_timeout,
        trajectory_timeout=run.trajectory_timeout,
        tree=tree,
    )
    async with AsyncExitStack() as stack:
        spec = run.agent_spec()
        if spec.kind == "vllm" and not spec.urls:
            typer.echo(f"starting a vLLM server for {spec.model} ...", err=True)
        agent = await make_agent(spec, stack)
        writer = TrajectoryWriter(out) if out else None
        if writer is not None:
            stack.callback(writer.close)
        engine = RolloutEngine(
            env, agent, config, env_kwargs=env_kwargs, on_trajectory=writer.write if writer else None
        )
        trajectories = await _with_progress(engine, range(run.seed, run.seed + run.n))
    stats = engine.stats.as_dict()
    examples: dict[str, str] = {}
    for t in trajectories:
        if t.masked:
            examples.setdefault(t.mask_reason, t.metadata.get("error", ""))
    if examples:
        stats["example_errors"] = examples
    if out:
        (Path(out) / "stats.json").write_text(json.dumps(stats, indent=2))
    return stats, trajectories


async def _with_progress(engine: Any, seeds: range) -> list[Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("turns {task.fields[turns]}  {task.fields[tps]:.0f} tok/s  errors {task.fields[errors]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, transient=False) as progress:
        bar = progress.add_task(
            "trajectories", total=len(seeds) * engine.config.group_size, turns=0, tps=0.0, errors=0
        )

        def refresh() -> None:
            s = engine.stats
            if engine.config.tree is not None:  # a tree's paths are known as it branches
                progress.update(bar, total=max(s.requested, len(seeds)))
            progress.update(bar, completed=s.finished, turns=s.turns, tps=s.tokens_per_s, errors=s.masked)

        run = asyncio.ensure_future(engine.run(seeds))
        while not run.done():
            refresh()
            await asyncio.wait([run], timeout=0.2)
        refresh()
        return run.result()
