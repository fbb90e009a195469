"""Train the tiny model on arith with any credit method, on CPU, in a couple of steps.

    python examples/train_credit.py --method igpo
    python examples/train_credit.py --method gigpo --steps 5 --sft-steps 40   # warm start first
    python examples/train_credit.py --method arena -- optim.lr=3e-4           # extra config overrides

It drives ``examples/configs/grpo_arith_cpu.yaml`` from Python (``load_config`` + ``Trainer``, the
same objects ``turngym train`` uses) with the method switched and the settings each method needs
on arith:

* ``grpo``  — group-normalised outcome (``correct`` + ``format``), broadcast to every turn;
* ``igpo``  — information gain of each calculate turn about the gold value (teacher-forced in
  arith's own answer frame ``{"name": "answer", "arguments": {"value": <gold>}}``), outcome last;
* ``gated`` — r_high = ``correct``, r_low = the other components, counted only when correct;
* ``arena`` — a single-elimination tournament judged by a programmatic judge (higher reward wins,
  then fewer invalid turns);
* ``gigpo`` — episode advantage + step advantage within anchor states (arith's state key: the
  values computed so far);
* ``turn``  — dual-level: trajectory z-score + turn-level discounted rewards.

The run directory gets ``metrics.jsonl``, TensorBoard events, trajectories (with each turn's
advantage) and the final weights; ``turngym view RUN_DIR`` renders them. The last line printed is
a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from turngym.core.types import Trajectory
from turngym.trainer.config import load_config
from turngym.trainer.judges import ProgrammaticJudge
from turngym.trainer.loop import Trainer
from turngym.trainer.metrics import read_metrics

CONFIG = Path(__file__).resolve().parent / "configs" / "grpo_arith_cpu.yaml"
METHODS = ("grpo", "igpo", "gated", "arena", "gigpo", "turn")
#: per-method settings for arith (everything else comes from the config)
METHOD_OVERRIDES: dict[str, list[str]] = {
    "grpo": [],
    "igpo": [
        'credit.igpo.prefix=\'<tool_call>{"name": "answer", "arguments": {"value": \'',
        "credit.igpo.suffix='}}</tool_call><|im_end|>'",
    ],
    "gated": ["credit.gated.high_component=correct"],
    "arena": ["credit.arena.topology=single_elimination", "credit.arena.workers=1"],
    "gigpo": [],
    "turn": [],
}


def better_episode(a: Trajectory, b: Trajectory) -> tuple[float, float]:
    """Arena judge: the higher total reward wins; equal rewards -> fewer invalid turns wins."""

    def key(t: Trajectory) -> tuple[float, int]:
        return t.total_reward, -sum(turn.invalid_action for turn in t.turns)

    ka, kb = key(a), key(b)
    return float(ka > kb), float(kb > ka)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--method", choices=METHODS, required=True)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--sft-steps", type=int, default=0, help="supervised warm start on expert episodes first")
    ap.add_argument("--run-dir", help="default runs/<method>-arith")
    ap.add_argument("overrides", nargs="*", help="extra dotted config overrides, e.g. optim.lr=3e-4")
    a = ap.parse_args(argv)
    run_dir = a.run_dir or f"runs/{a.method}-arith"
    cfg = load_config(
        CONFIG,
        [
            f"run_dir={run_dir}",
            f"steps={a.steps}",
            f"sft.steps={a.sft_steps}",
            f"credit.method={a.method}",
            "rollout.tasks_per_step=2",
            "rollout.group_size=4",
            "rollout.max_tokens=24",
            "rollout.env_kwargs={depth: 1, max_turns: 3}",
            "log.progress=false",
            *METHOD_OVERRIDES[a.method],
            *a.overrides,
        ],
    )
    judge = ProgrammaticJudge(better_episode) if a.method == "arena" else None

    def on_step(step: int, m: dict) -> None:
        print(
            f"step {step}: outcome {m.get('reward/outcome', 0):+.3f}  total {m.get('reward/total', 0):+.3f}  "
            f"|adv| {m.get('credit/adv_abs_mean', 0):.3f}  loss {m.get('update/loss', 0):+.4f}  "
            f"grad norm {m.get('update/grad_norm', 0):.3f}  ({m.get('time/rollout', 0):.1f}s rollout, "
            f"{m.get('time/update', 0):.1f}s update)",
            flush=True,
        )

    summary = Trainer(cfg, judge=judge).train(on_step=on_step)
    rows = read_metrics(summary["run_dir"])
    last = rows[-1] if rows else {}
    print(
        json.dumps(
            {
                "method": a.method,
                "steps": summary["step"],
                "run_dir": str(summary["run_dir"]),
                "reward_outcome": last.get("reward/outcome"),
                "adv_abs_mean": last.get("credit/adv_abs_mean"),
                "grad_norm": last.get("update/grad_norm"),
                "credit_metrics": {k: v for k, v in last.items() if k.split("/")[0] in (a.method, "credit")},
            }
        )
    )
    return 0 if summary["step"] == a.steps else 1


if __name__ == "__main__":
    sys.exit(main())
