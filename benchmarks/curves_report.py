"""Pack a ``train_curves.py`` run directory (one ``METHOD-sSEED/metrics.jsonl`` per run) into the
compact JSON and the plot that docs/credit.md shows: held-out F1 per method (mean over seeds with the
seeds' min-max band, each seed a thin line), the same per hop count where the eval was broken down by
hops, and the training outcome (sampled, 5-step moving mean).

    python benchmarks/curves_report.py RUN_DIR --card "4x NVIDIA H200" --session "issue 18 session 4" \
        --out docs/credit_curves_smollm2_h200x4

prints a table of held-out F1 per method and eval step (mean, sd, min, max over the seeds).
Another env's headline: ``--eval-metric eval/judge/win_rate --eval-label "judge win rate vs warm
start"`` (travel-open, arena vs pointwise); ``--train-extra gated/low_mean`` adds a panel of that
training metric (G-RA: the stepwise reward direct accumulation can farm) and a column to the JSON;
repeat it for more (``--train-extra gated/outcome_mean``: the outcome alone).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

EVAL_METRIC = "eval/reward/outcome"  # the default headline: held-out F1 on search-qa
EVAL = ["step", "f1", "f1_2hop", "f1_3hop", "turns_3hop", "masked_frac"]
TRAIN = ["step", "f1", "turns", "s_step", "s_rollout", "s_update", "s_credit", "ig_separation", "kl"]


def read_run(
    path: Path, eval_metric: str = EVAL_METRIC, train_extra: list[str] | None = None
) -> dict[str, list[list]]:
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    ev = [
        [
            r["step"],
            r[eval_metric],
            r.get("eval/by_hops/2/reward/outcome"),
            r.get("eval/by_hops/3/reward/outcome"),
            r.get("eval/by_hops/3/episode/turns"),
            r.get("eval/reward/masked_frac"),
        ]
        for r in rows
        if eval_metric in r
    ]
    tr = [
        [
            r["step"],
            r["reward/outcome"],
            r.get("episode/turns"),
            r.get("time/step"),
            r.get("time/rollout"),
            r.get("time/update"),
            r.get("time/credit"),
            r.get("ig/separation"),
            r.get("update/kl"),
            *(r.get(name) for name in train_extra or []),
        ]
        for r in rows
        if "reward/outcome" in r and "time/step" in r
    ]
    return {"eval": ev, "train": tr}


def load(run_dir: Path, eval_metric: str = EVAL_METRIC, train_extra: list[str] | None = None):
    """``{"grpo-s0": {"eval": [...], "train": [...]}, ...}`` for every run under ``run_dir``."""
    runs = {}
    for f in sorted(run_dir.glob("*-s*/metrics.jsonl")):
        runs[f.parent.name] = read_run(f, eval_metric, train_extra)
    if not runs:
        raise SystemExit(f"{run_dir}: no METHOD-sSEED/metrics.jsonl")
    return runs


def method_of(run: str) -> str:
    return run.rsplit("-s", 1)[0]


def by_method(runs: dict[str, dict], column: int) -> dict[str, dict[int, list[float]]]:
    """``{method: {eval step: [value per seed]}}`` for one column of the eval rows."""
    out: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for name, run in runs.items():
        for row in run["eval"]:
            if row[column] is not None:
                out[method_of(name)][row[0]].append(row[column])
    return out


def table(runs: dict[str, dict]) -> str:
    lines = ["| method | step | seeds | mean | sd | min | max | 2-hop | 3-hop |", "| --- " * 9 + "|"]
    f1, h2, h3 = (by_method(runs, c) for c in (1, 2, 3))
    for method, steps in f1.items():
        for step, vals in sorted(steps.items()):
            sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
            hop = [statistics.mean(d[method][step]) if d[method][step] else float("nan") for d in (h2, h3)]
            lines.append(
                f"| {method} | {step} | {len(vals)} | {statistics.mean(vals):.3f} | {sd:.3f} | "
                f"{min(vals):.3f} | {max(vals):.3f} | {hop[0]:.2f} | {hop[1]:.2f} |"
            )
    return "\n".join(lines)


def plot(
    runs: dict[str, dict],
    title: str,
    dest: Path,
    eval_label: str = "held-out F1 (greedy)",
    train_extra: list[str] | None = None,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(1, eval_label), (2, "held-out F1, 2-hop"), (3, "held-out F1, 3-hop")]
    panels = [p for p in panels if by_method(runs, p[0])]  # no per-hop panels for an eval without hops
    extra = list(train_extra or [])
    fig, axes = plt.subplots(
        1, len(panels) + 1 + len(extra), figsize=(5 * (len(panels) + len(extra)) + 5, 4.5)
    )
    colors = {}
    for ax, (col, name) in zip(axes, panels, strict=False):
        for method, steps in by_method(runs, col).items():
            c = colors.setdefault(method, f"C{len(colors)}")
            seeds = max(map(len, steps.values()))
            # the mean and band only where every seed has an eval (a seed the deadline stopped early
            # would otherwise turn the "mean" into one run's value); later points stay as thin lines
            xs = [x for x in sorted(steps) if len(steps[x]) == seeds]
            mean = [statistics.mean(steps[x]) for x in xs]
            ax.fill_between(xs, [min(steps[x]) for x in xs], [max(steps[x]) for x in xs], color=c, alpha=0.15)
            ax.plot(xs, mean, color=c, lw=2, label=f"{method} (mean of {seeds})")
            for run, data in runs.items():
                if method_of(run) == method:
                    pts = [(r[0], r[col]) for r in data["eval"] if r[col] is not None]
                    ax.plot(*zip(*pts, strict=True), color=c, lw=0.6, alpha=0.5)
        ax.set(title=name, xlabel="RL step")
        ax.legend(fontsize=7)
    train_panels = [(1, "train outcome (sampled, 5-step mean)")]
    train_panels += [(len(TRAIN) + k, f"train {name} (5-step mean)") for k, name in enumerate(extra)]
    for ax, (col, name) in zip(axes[len(panels) :], train_panels, strict=True):
        for run, data in runs.items():
            c = colors.setdefault(method_of(run), f"C{len(colors)}")
            pts = [(r[0], r[col]) for r in data["train"] if r[col] is not None]
            ys = [y for _, y in pts]
            smooth = [statistics.mean(ys[max(0, i - 4) : i + 1]) for i in range(len(ys))]
            ax.plot([x for x, _ in pts], smooth, color=c, lw=0.8)
        ax.set(title=name, xlabel="RL step")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(dest, dpi=90)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--card", required=True)
    ap.add_argument("--session", required=True)
    ap.add_argument(
        "--out", type=Path, required=True, help="path without suffix: writes OUT.json and OUT.png"
    )
    ap.add_argument("--eval-metric", default=EVAL_METRIC, help="the eval curve's metric")
    ap.add_argument("--eval-label", default="held-out F1 (greedy)", help="its panel's title")
    ap.add_argument(
        "--train-extra",
        action="append",
        default=[],
        help="a training metric for one more panel (e.g. gated/low_mean); repeat for more",
    )
    args = ap.parse_args()
    runs = load(args.run_dir, args.eval_metric, args.train_extra)
    columns = {
        "eval": [EVAL[0], "f1" if args.eval_metric == EVAL_METRIC else args.eval_metric, *EVAL[2:]],
        "train": TRAIN + args.train_extra,
    }
    doc = {"card": args.card, "session": args.session, "columns": columns, "runs": runs}
    args.out.with_suffix(".json").write_text(json.dumps(doc, separators=(",", ":")))
    title = f"{args.session} — {args.card}"
    plot(runs, title, args.out.with_suffix(".png"), args.eval_label, args.train_extra)
    print(table(runs))


if __name__ == "__main__":
    main()
