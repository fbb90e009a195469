"""CLI commands of the trainer (wired into ``turngym`` by ``turngym/cli.py``): ``train`` and ``sft``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer


def torchrun_command(
    nproc: int,
    config: Path | None,
    overrides: list[str],
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str | None = None,
    master_port: int = 29500,
) -> list[str]:
    """The torchrun command line of the learner: ``nproc`` processes on this node; with ``nnodes > 1``
    this node is ``node_rank`` of a job whose rendezvous is rank 0's node at ``master_addr:master_port``
    (every node runs the same command with its own ``node_rank``)."""
    import sys

    if nnodes < 1 or not 0 <= node_rank < nnodes:
        raise typer.BadParameter(f"--node-rank must be in [0, --nnodes) (got {node_rank} of {nnodes})")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
    if nnodes == 1:
        cmd.insert(3, "--standalone")
    else:
        if not master_addr:
            raise typer.BadParameter("--nnodes > 1 needs --master-addr (the address of node 0)")
        cmd += [f"--nnodes={nnodes}", f"--node-rank={node_rank}"]
        cmd += [f"--master-addr={master_addr}", f"--master-port={master_port}"]
    return cmd + ["-m", "turngym.trainer.torchrun_entry", *([str(config)] if config else []), *overrides]


def _torchrun(nproc: int, config: Path | None, overrides: list[str], **nodes: object) -> int:
    """Run the data-parallel learner under torchrun (:func:`torchrun_command`); its exit code."""
    import subprocess

    return subprocess.call(torchrun_command(nproc, config, overrides, **nodes))  # type: ignore[arg-type]


#: the config arguments of every trainer command (``_split_args`` reads them): a YAML file, then dotted overrides
ConfigArg = Annotated[Path | None, typer.Argument(help="YAML training config (omit for the defaults)")]
OverridesArg = Annotated[
    list[str] | None,
    typer.Argument(help="dotted overrides, e.g. optim.lr=1e-5 credit.method=igpo sft.steps=200"),
]


def _split_args(config: Path | None, overrides: list[str] | None) -> tuple[Path | None, list[str]]:
    """``turngym train key=value ...`` without a config file: the first argument is an override too."""
    rest = list(overrides or [])
    if config is not None and not config.exists():
        if "=" in str(config):
            return None, [str(config), *rest]
        raise typer.BadParameter(f"config file {config} does not exist")
    return config, rest


def heldout_summary(run_dir: str | Path) -> str | None:
    """The run's held-out before/after lines (first and last eval of ``metrics.jsonl``: the greedy
    eval's, then the sampled eval's when the run has one), one per line, or None."""
    from turngym.trainer.metrics import read_metrics
    from turngym.viewer.report import eval_summaries

    return "\n".join(eval_summaries(read_metrics(run_dir))) or None


def train(
    config: ConfigArg = None,
    overrides: OverridesArg = None,
    nproc: Annotated[
        int | None,
        typer.Option(help="learner processes (data parallel, torchrun); default: the config's cluster.nproc"),
    ] = None,
    nnodes: Annotated[int, typer.Option(help="nodes of the job (torchrun rendezvous; --nproc per node)")] = 1,
    node_rank: Annotated[int, typer.Option(help="this node's rank, 0 .. nnodes-1")] = 0,
    master_addr: Annotated[
        str | None, typer.Option(help="address of node 0 (needed with --nnodes > 1)")
    ] = None,
    master_port: Annotated[int, typer.Option(help="rendezvous port on node 0")] = 29500,
) -> None:
    """Train a policy with RL (SFT warm start first when sft.steps > 0) and print where the results are."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from turngym.trainer.checkpoint import CheckpointError
    from turngym.trainer.config import load_config
    from turngym.trainer.loop import Trainer

    console = Console()
    config, overrides = _split_args(config, overrides)
    cfg = load_config(config, overrides)
    procs = nproc if nproc is not None else cfg.cluster.nproc
    if (procs > 1 or nnodes > 1) and "WORLD_SIZE" not in os.environ:
        nodes = {
            "nnodes": nnodes,
            "node_rank": node_rank,
            "master_addr": master_addr,
            "master_port": master_port,
        }
        raise typer.Exit(_torchrun(procs, config, [*overrides, f"cluster.nproc={procs}"], **nodes))
    trainer = Trainer(cfg)
    console.print(
        f"[bold]turngym train[/] env={cfg.rollout.env} method={cfg.credit.method} model={cfg.model.path} run_dir={cfg.run_dir}"
    )
    with Progress(
        TextColumn("[bold]step"),
        MofNCompleteColumn(),
        BarColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=console,
        disable=not cfg.log.progress,
    ) as progress:
        task = progress.add_task("train", total=cfg.steps, info="setting up")
        trainer.setup()
        progress.update(task, completed=trainer.step, info="warm start / resume")

        def on_step(step: int, m: dict) -> None:
            info = (
                f"outcome {m.get('reward/outcome', 0):+.3f} total {m.get('reward/total', 0):+.3f} "
                f"success {m.get('reward/success', 0):.2f} masked {m.get('reward/masked_frac', 0):.0%} "
                f"kl {m.get('update/kl', 0):.4f} "
                f"{m.get('rollout/tokens_per_s', 0):.0f} tok/s | rollout {m.get('time/rollout', 0):.1f}s "
                f"credit {m.get('time/credit', 0):.1f}s update {m.get('time/update', 0):.1f}s"
            )
            progress.update(task, completed=step, info=info)
            progress.console.print(f"step {step}: {info}")

        try:
            summary = trainer.train(on_step=on_step)
        except CheckpointError as e:  # a full disk, or no intact checkpoint: the message says what to do
            console.print(f"[red]checkpoint error[/]: {e}", highlight=False, soft_wrap=True)
            raise typer.Exit(1) from e
    run = Path(summary["run_dir"])
    console.print(
        f"[green]done[/] at step {summary['step']}: metrics {run / 'metrics.jsonl'}, tensorboard {run / 'tb'}, "
        f"trajectories {run / 'trajectories'}, checkpoints {run / 'checkpoints'}, model {run / 'final'}"
    )
    for line in (heldout_summary(run) or "").splitlines():
        console.print(f"[bold]{line}[/]", highlight=False, soft_wrap=True)
    best = run / "best" / "best.json"
    if cfg.keep_best is not None and best.exists():
        b = json.loads(best.read_text())
        console.print(
            f"best {b['metric']} {b['value']:.3f} at step {b['step']}: model {run / 'best'}", highlight=False
        )


def sft(config: ConfigArg = None, overrides: OverridesArg = None) -> None:
    """Supervised warm start on scripted-expert trajectories, as the sft section of the config sets it;
    saves the model under RUN_DIR/sft."""
    from rich.console import Console

    from turngym.agents.models import load_model, load_tokenizer
    from turngym.trainer.config import load_config
    from turngym.trainer.sft import sft_from_config

    console = Console()
    cfg = load_config(*_split_args(config, overrides))
    s = cfg.sft
    if s.steps <= 0:
        raise typer.BadParameter("sft.steps must be > 0")
    tok = load_tokenizer(cfg.model.path)
    model = load_model(cfg.model.path, device=cfg.model.device, dtype=cfg.model.dtype)
    console.print(f"expert trajectories from {cfg.rollout.env}, then {s.steps} SFT steps")
    info = sft_from_config(
        cfg,
        model,
        tok,
        log=lambda k, loss: (
            console.print(f"sft step {k + 1}/{s.steps} loss {loss:.4f}")
            if (k + 1) % 10 == 0 or k == 0
            else None
        ),
    )
    out = Path(cfg.run_dir) / "sft"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    console.print(
        f"[green]done[/]: {info['sft/sequences']:.0f} expert sequences, loss {info['sft/loss_first']:.3f} "
        f"-> {info['sft/loss_last']:.3f}; model saved to {out}"
    )
