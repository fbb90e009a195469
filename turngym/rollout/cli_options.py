"""The typed options of ``turngym rollout`` and ``turngym eval``: pydantic models whose fields carry
their command-line flags (Typer reads the ``Annotated`` metadata, pydantic validates the values).

:func:`with_options` adds the models' fields to a command's signature and hands the command one
validated model per group (``run: RunOptions``, ``tree: TreeOptions``) instead of loose keywords.
"""

from __future__ import annotations

import functools
import inspect
import typing
from typing import Annotated, Any, ClassVar

import typer
from pydantic import BaseModel, ConfigDict, Field, ValidationError

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


def use_hf_worker(flag: bool | None) -> bool:
    """``--hf-worker/--hf-in-process``, or without either a worker exactly when CUDA is available."""
    if flag is not None:
        return flag
    import torch

    return torch.cuda.is_available()


class CommandOptions(BaseModel):
    """A group of command-line options; ``param`` is the keyword the command receives it under."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    param: ClassVar[str]


class RunOptions(CommandOptions):
    """An agent run: which agent, which tasks, how to sample (every command that runs an agent)."""

    param: ClassVar[str] = "run"

    backend: BackendOpt = "scripted"
    model: ModelOpt = None
    n: NOpt = Field(8, ge=1)
    g: GOpt = Field(1, ge=1)
    seed: SeedOpt = 0
    concurrency: ConcOpt = Field(64, ge=1)
    max_tokens: MaxTokOpt = Field(256, ge=1)
    temperature: TempOpt = Field(1.0, ge=0.0)
    max_context: CtxOpt = Field(4096, ge=1)
    url: UrlOpt = None
    base_url: BaseUrlOpt = None
    env_arg: EnvKwOpt = None
    turn_timeout: TurnTOpt = Field(300.0, gt=0.0)
    trajectory_timeout: TrajTOpt = Field(3600.0, gt=0.0)
    dtype: DtypeOpt = "auto"
    hf_worker: WorkerOpt = None
    hf_engine: EngineOpt = "auto"
    hf_compile: CompileOpt = None

    def agent_spec(self) -> Any:
        """The ``AgentSpec`` (``turngym.agents.factory``) of these options: ``--backend hf`` is the
        ``hf_worker`` kind under ``--hf-worker`` (by default when CUDA is available)."""
        from turngym.agents.factory import AgentSpec

        kind = self.backend
        if kind == "hf" and use_hf_worker(self.hf_worker):
            kind = "hf_worker"
        same = self.model_dump(include=set(AgentSpec.model_fields) - {"kind"})  # the options named alike
        return AgentSpec(kind=kind, urls=self.url or [], max_batch_size=self.concurrency, **same)


class TreeOptions(CommandOptions):
    """``rollout --tree``: grow a tree per task (``turngym.rollout.tree``)."""

    param: ClassVar[str] = "tree"

    tree: TreeOpt = False
    tree_k: TreeKOpt = 2
    tree_branch: TreeBranchOpt = "schedule"
    tree_turns: TreeTurnsOpt = "0"
    tree_entropy: TreeEntropyOpt = 1.0
    tree_max_nodes: TreeNodesOpt = 64
    tree_max_tokens: TreeTokensOpt = None
    tree_fallback_flat: TreeFlatOpt = False

    def config(self) -> Any:
        """The ``TreeConfig`` (None without ``--tree``); a bad setting is a ``typer.BadParameter``."""
        if not self.tree:
            return None
        from turngym.rollout.tree import TreeConfig

        try:
            turns = tuple(int(x) for x in self.tree_turns.split(",") if x.strip())
            return TreeConfig(
                k=self.tree_k,
                branch=self.tree_branch,
                turns=turns,
                entropy_threshold=self.tree_entropy,
                max_nodes=self.tree_max_nodes,
                max_tokens=self.tree_max_tokens,
                fallback_flat=self.tree_fallback_flat,
            )
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--tree") from e


def option_parameters(model: type[CommandOptions], **defaults: Any) -> list[inspect.Parameter]:
    """The model's fields as keyword parameters with their ``Annotated`` flags (for Typer), each
    default taken from ``defaults`` where given."""
    unknown = set(defaults) - set(model.model_fields)
    if unknown:
        raise TypeError(f"{model.__name__} has no option(s) {sorted(unknown)}")
    hints = typing.get_type_hints(model, include_extras=True)
    return [
        inspect.Parameter(
            name,
            inspect.Parameter.KEYWORD_ONLY,
            default=defaults.get(name, field.default),
            annotation=hints[name],
        )
        for name, field in model.model_fields.items()
    ]


def option_flag(model: type[CommandOptions], name: str) -> str:
    """The command-line flag of the model's field ``name`` (its first ``typer.Option`` name)."""
    for meta in getattr(typing.get_type_hints(model, include_extras=True).get(name), "__metadata__", ()):
        decls = getattr(meta, "param_decls", None)
        if decls:
            return decls[0].split("/")[0]
    return "--" + name.replace("_", "-")


def with_options(*models: type[CommandOptions], after: int, **defaults: Any) -> Any:
    """Add the models' fields to a command's signature, after its first ``after`` parameters (with
    this command's ``defaults``); the command receives one validated model per group under the
    model's ``param`` (a value pydantic refuses is a ``typer.BadParameter`` naming the option)."""
    groups = {m: {k: v for k, v in defaults.items() if k in m.model_fields} for m in models}
    unknown = set(defaults) - {k for m in models for k in m.model_fields}
    if unknown:
        raise TypeError(f"no option(s) {sorted(unknown)}")
    added = [p for m in models for p in option_parameters(m, **groups[m])]

    def decorate(fn: Any) -> Any:
        own = [
            p
            for p in inspect.signature(fn, eval_str=True).parameters.values()
            if p.name not in {m.param for m in models}
        ]

        @functools.wraps(fn)
        def command(**kwargs: Any) -> Any:
            for m in models:
                values = {k: kwargs.pop(k) for k in m.model_fields if k in kwargs}
                try:
                    kwargs[m.param] = m(**{**groups[m], **values})
                except ValidationError as e:
                    bad = e.errors()[0]
                    flag = option_flag(m, str(bad["loc"][0])) if bad["loc"] else m.param
                    raise typer.BadParameter(bad["msg"], param_hint=flag) from e
            return fn(**kwargs)

        keyword = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own[after:]]
        command.__signature__ = inspect.Signature(own[:after] + added + keyword)  # type: ignore[attr-defined]
        return command

    return decorate
