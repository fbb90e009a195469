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
import functools
import inspect
import json
import math
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Annotated, Any

import typer

from turngym.cli_args import parse_key_values

EnvArg = Annotated[str, typer.Argument(help="Environment id (see `turngym envs`).")]
BackendOpt = Annotated[
    str,
    typer.Option(
        "--backend",
        "-b",
        help="vllm | hf | openai | scripted | random, or a kind registered with @agent_kind.",
    ),
]
ModelOpt = Annotated[
    str | None, typer.Option("--model", "-m", help="Model path or hub id; 'tiny' builds a tiny random model.")
]
NOpt = Annotated[int, typer.Option("-n", help="Number of tasks (seeds seed..seed+n-1).")]
GOpt = Annotated[int, typer.Option("-g", help="Samples per task (group size).")]
SeedOpt = Annotated[int, typer.Option("--seed", help="First task seed.")]
ConcOpt = Annotated[int, typer.Option("--concurrency", "-c", help="Live trajectories at most.")]
MaxTokOpt = Annotated[int, typer.Option("--max-tokens", help="Tokens per generation at most.")]
TempOpt = Annotated[float, typer.Option("--temperature", help="Sampling temperature (0 = greedy).")]
CtxOpt = Annotated[int, typer.Option("--max-context", help="Context length (prompt + all turns) at most.")]
UrlOpt = Annotated[list[str] | None, typer.Option("--url", help="vLLM server URL (repeat for several).")]
BaseUrlOpt = Annotated[str | None, typer.Option("--base-url", help="OpenAI-compatible API base URL.")]
EnvKwOpt = Annotated[
    list[str] | None,
    typer.Option("--env-arg", help="Env constructor argument KEY=VALUE (VALUE parsed as JSON)."),
]
TurnTOpt = Annotated[float, typer.Option("--turn-timeout", help="Seconds per turn (generation + step).")]
TrajTOpt = Annotated[float, typer.Option("--trajectory-timeout", help="Seconds per trajectory.")]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="Model dtype (auto, float32, bfloat16).")]
TreeOpt = Annotated[
    bool,
    typer.Option(
        "--tree",
        help="Grow a tree per task (K children from env forks at branching turns) instead of -g samples.",
    ),
]
TreeKOpt = Annotated[int, typer.Option("--tree-k", help="Children per branch point.")]
TreeBranchOpt = Annotated[
    str,
    typer.Option(
        "--tree-branch",
        help="Where to branch: schedule (the --tree-turns), tool_call (every turn after a tool result) or "
        "entropy (turns whose sampled tokens' mean -logprob >= --tree-entropy; token-level backends).",
    ),
]
TreeTurnsOpt = Annotated[
    str, typer.Option("--tree-turns", help="schedule: branching turns, comma-separated.")
]
TreeEntropyOpt = Annotated[
    float,
    typer.Option("--tree-entropy", help="entropy: mean sampled-token NLL (nats) that triggers a branch."),
]
TreeNodesOpt = Annotated[
    int | None, typer.Option("--tree-max-nodes", help="Branch only while a tree has fewer nodes (turns).")
]
TreeTokensOpt = Annotated[
    int | None, typer.Option("--tree-max-tokens", help="Branch only while a tree sampled fewer tokens.")
]
TreeFlatOpt = Annotated[
    bool,
    typer.Option(
        "--tree-fallback-flat", help="An env that cannot fork runs flat groups of K instead of failing."
    ),
]


def tree_config(a: dict[str, Any]) -> Any:
    """The ``TreeConfig`` of the ``--tree*`` options (None without ``--tree``)."""
    if not a.get("tree"):
        return None
    from turngym.rollout.tree import TreeConfig

    try:
        turns = tuple(int(x) for x in str(a["tree_turns"]).split(",") if x.strip())
        return TreeConfig(
            k=a["tree_k"],
            branch=a["tree_branch"],
            turns=turns,
            entropy_threshold=a["tree_entropy"],
            max_nodes=a["tree_max_nodes"],
            max_tokens=a["tree_max_tokens"],
            fallback_flat=a["tree_fallback_flat"],
        )
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e


def use_hf_worker(flag: bool | None) -> bool:
    """``--hf-worker/--hf-in-process``, or without either a worker exactly when CUDA is available."""
    if flag is not None:
        return flag
    import torch

    return torch.cuda.is_available()


WorkerOpt = Annotated[
    bool | None,
    typer.Option(
        "--hf-worker/--hf-in-process",
        help="hf backend: run the model in a worker process with its own GIL, or in this process. "
        "Default: a worker when CUDA is available (on an H100 the engine kept 99% of the bare "
        "backend tokens/s with a worker, 86% in-process), in-process on CPU.",
        show_default=False,
    ),
]

EngineOpt = Annotated[
    str,
    typer.Option(
        "--hf-engine",
        help="hf backend engine: auto (slots on CUDA, else continuous), continuous (growing KV cache, "
        "eager passes) or slots (fixed KV slots, decode steps replayed as CUDA graphs).",
    ),
]

CompileOpt = Annotated[
    str | None,
    typer.Option(
        "--hf-compile",
        help="slots engine: torch.compile its decode step before capturing it (default, "
        "max-autotune-no-cudagraphs or dynamic; turngym.agents.hf.registry.COMPILE_SETTINGS). Off when unset.",
        show_default=False,
    ),
]


def agent_run_options(
    backend: BackendOpt = "scripted",
    model: ModelOpt = None,
    n: NOpt = 8,
    g: GOpt = 1,
    seed: SeedOpt = 0,
    concurrency: ConcOpt = 64,
    max_tokens: MaxTokOpt = 256,
    temperature: TempOpt = 1.0,
    max_context: CtxOpt = 4096,
    url: UrlOpt = None,
    base_url: BaseUrlOpt = None,
    env_arg: EnvKwOpt = None,
    turn_timeout: TurnTOpt = 300.0,
    trajectory_timeout: TrajTOpt = 3600.0,
    dtype: DtypeOpt = "auto",
    hf_worker: WorkerOpt = None,
    hf_engine: EngineOpt = "auto",
    hf_compile: CompileOpt = None,
) -> None:
    """The options of an agent run (which agent, which tasks, how to sample), one home for every
    command that runs one: :func:`with_run_options` adds them to a command."""


def with_run_options(after: int, **defaults: Any) -> Any:
    """Add :func:`agent_run_options`' parameters to a command's signature, after its first ``after``
    parameters and with this command's ``defaults``; the command receives them in ``**run``."""
    shared = inspect.signature(agent_run_options, eval_str=True).parameters
    unknown = set(defaults) - set(shared)
    if unknown:
        raise TypeError(f"no run option(s) {sorted(unknown)}")
    options = [p.replace(default=defaults.get(name, p.default)) for name, p in shared.items()]

    def decorate(fn: Any) -> Any:
        own = [p for p in inspect.signature(fn, eval_str=True).parameters.values() if p.kind != p.VAR_KEYWORD]

        @functools.wraps(fn)
        def command(**kwargs: Any) -> Any:
            return fn(**kwargs)

        command.__signature__ = inspect.Signature(own[:after] + options + own[after:])  # type: ignore[attr-defined]
        return command

    return decorate


@with_run_options(after=2)
def rollout(
    env: EnvArg,
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory.")],
    tree: TreeOpt = False,
    tree_k: TreeKOpt = 2,
    tree_branch: TreeBranchOpt = "schedule",
    tree_turns: TreeTurnsOpt = "0",
    tree_entropy: TreeEntropyOpt = 1.0,
    tree_max_nodes: TreeNodesOpt = 64,
    tree_max_tokens: TreeTokensOpt = None,
    tree_fallback_flat: TreeFlatOpt = False,
    **run: Any,
) -> None:
    """Generate trajectories and save them as JSONL and parquet (--tree: a tree per task)."""
    stats, _ = _run(
        env=env,
        out=out,
        tree=tree,
        tree_k=tree_k,
        tree_branch=tree_branch,
        tree_turns=tree_turns,
        tree_entropy=tree_entropy,
        tree_max_nodes=tree_max_nodes,
        tree_max_tokens=tree_max_tokens,
        tree_fallback_flat=tree_fallback_flat,
        **run,
    )
    typer.echo(json.dumps(stats, indent=2))


@with_run_options(after=1, n=32, temperature=0.0)
def eval(  # noqa: A001 - the command is called eval
    env: EnvArg,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Also save trajectories and eval.json.")
    ] = None,
    threshold: Annotated[float, typer.Option("--threshold", help="Success: outcome reward >= this.")] = 1.0,
    **run: Any,
) -> None:
    """Success rate (Wilson 95% interval) and mean reward (95% interval) of an agent on an env."""
    from rich.console import Console
    from rich.table import Table

    stats, trajectories = _run(env=env, out=out, **run)
    report = summarize(trajectories, threshold)
    report["stats"] = stats
    backend, model = run["backend"], run["model"]
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


def _run(**a: Any) -> tuple[dict[str, Any], list[Any]]:
    from turngym.agents.factory import NEEDS_MODEL, agent_kinds

    if a["backend"] not in agent_kinds():  # the built-in kinds and any registered with @agent_kind
        raise typer.BadParameter(f"--backend must be one of {', '.join(agent_kinds())}")
    if a["backend"] in NEEDS_MODEL and not a["model"]:
        raise typer.BadParameter(f"--backend {a['backend']} needs --model")
    from turngym.core.env import NotForkable
    from turngym.rollout.tree import TreeError

    try:
        return asyncio.run(_run_async(a))
    except NotForkable as e:  # --tree on an env that cannot fork: said before any episode ran
        raise typer.BadParameter(str(e), param_hint="--tree") from e
    except TreeError as e:  # a tree that cannot grow as configured (k above the env's max_live, ...)
        raise typer.BadParameter(str(e), param_hint="--tree") from e


async def _run_async(a: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    from turngym.rollout.engine import RolloutConfig, RolloutEngine
    from turngym.rollout.store import TrajectoryWriter

    env_kwargs = parse_key_values(a["env_arg"])
    if a["backend"] == "openai":
        env_kwargs.setdefault("tools_in_prompt", False)
    config = RolloutConfig(
        group_size=a["g"],
        max_concurrency=a["concurrency"],
        turn_timeout=a["turn_timeout"],
        trajectory_timeout=a["trajectory_timeout"],
        tree=tree_config(a),
    )
    async with AsyncExitStack() as stack:
        agent = await _make_agent(a, stack)
        writer = TrajectoryWriter(a["out"]) if a.get("out") else None
        if writer is not None:
            stack.callback(writer.close)
        engine = RolloutEngine(
            a["env"], agent, config, env_kwargs=env_kwargs, on_trajectory=writer.write if writer else None
        )
        trajectories = await _with_progress(engine, range(a["seed"], a["seed"] + a["n"]))
    stats = engine.stats.as_dict()
    examples: dict[str, str] = {}
    for t in trajectories:
        if t.masked:
            examples.setdefault(t.mask_reason, t.metadata.get("error", ""))
    if examples:
        stats["example_errors"] = examples
    if a.get("out"):
        (Path(a["out"]) / "stats.json").write_text(json.dumps(stats, indent=2))
    return stats, trajectories


def agent_spec(a: dict[str, Any]) -> Any:
    """The command line's ``AgentSpec`` (``turngym.agents.factory``): ``--backend hf`` is the
    ``hf_worker`` kind under ``--hf-worker`` (by default when CUDA is available)."""
    from turngym.agents.factory import AgentSpec

    kind = a["backend"]
    if kind == "hf" and use_hf_worker(a["hf_worker"]):
        kind = "hf_worker"
    return AgentSpec(
        kind=kind,
        model=a["model"],
        urls=a["url"] or [],
        base_url=a["base_url"],
        dtype=a["dtype"],
        hf_engine=a["hf_engine"],
        hf_compile=a.get("hf_compile"),
        max_batch_size=a["concurrency"],
        max_context=a["max_context"],
        max_tokens=a["max_tokens"],
        temperature=a["temperature"],
        seed=a["seed"],
    )


async def _make_agent(a: dict[str, Any], stack: AsyncExitStack) -> Any:
    from turngym.agents.factory import make_agent

    spec = agent_spec(a)
    if spec.kind == "vllm" and not spec.urls:
        typer.echo(f"starting a vLLM server for {spec.model} ...", err=True)
    return await make_agent(spec, stack)


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
