"""Write a credit audit's results: ``audit.json`` (every number), ``audit.md`` (the table) and the
trajectories (``turngym view DIR`` shows each turn's A* beside every method's advantage, and the
audit's plots: each method's advantage against A*, and the correlations with their error bars)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _fmt(stat: dict[str, Any] | float | None, digits: int = 2) -> str:
    if stat is None:
        return "–"
    if isinstance(stat, dict):
        v, se = stat.get("value"), stat.get("se")
        if v is None:
            return "–"
        return f"{v:+.{digits}f} ± {se:.{digits}f}" if se is not None else f"{v:+.{digits}f}"
    return f"{stat:+.{digits}f}"


def markdown_table(report: dict[str, Any]) -> str:
    """The audit as a markdown table: one row per method, error bars from the cluster bootstrap."""
    a = report["a_star"]
    tok = report["tokens"]
    se_mean = a["se_mean"]
    lines = [
        f"**{report['env']}**: {report['trajectories']} trajectories ({report['masked']} masked), "
        f"success {report['success_rate']:.2f}, zero-spread groups {report['zero_groups']:.2f}, "
        f"{report['scored_turns']} scored turns; A* mean |A*| {_fmt(a['abs_mean'])}, "
        f"MC s.e. mean {se_mean:.3f}" + (f" (max {a['se_max']:.3f})" if a["se_max"] is not None else "")
        if se_mean is not None
        else f"**{report['env']}**: {report['trajectories']} trajectories, no A* with a standard error",
        f"tokens: {tok['generated']} sampled ({tok['forked']} in forks)"
        + (f", budget {tok['budget']} exhausted" if tok["budget_exhausted"] else ""),
        "",
        "| method | Spearman | Pearson | sign agreement | zero credit | mean adv (failed) | mean adv (succeeded) |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, m in report["methods"].items():
        if "error" in m:
            lines.append(f"| {label} | not run: {m['error'][:120]} | | | | | |")
            continue
        zero = m["zero_credit_frac"]
        fell = [k for k, v in m.get("metrics", {}).items() if "fallback" in k and v > 0]
        name = f"{label} (fell back: {', '.join(fell)})" if fell else label
        lines.append(
            f"| {name} | {_fmt(m['spearman'])} | {_fmt(m['pearson'])} | {_fmt(m['sign_agreement'])} | "
            f"{'–' if zero is None else f'{zero:.2f}'} | {_fmt(m['mean_adv_failed'])} | "
            f"{_fmt(m['mean_adv_succeeded'])} |"
        )
    return "\n".join(lines) + "\n"


def write_audit(out: str | Path, report: dict[str, Any], trajectories: list[Any]) -> Path:
    """``audit.json``, ``audit.md`` and ``trajectories.jsonl`` under ``out``; returns ``out``."""
    from turngym.rollout.store import TrajectoryWriter

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "audit.json").write_text(json.dumps(report, indent=2, default=str))
    (out / "audit.md").write_text(markdown_table(report))
    (out / "trajectories.jsonl").unlink(missing_ok=True)  # a rerun replaces, never appends
    with TrajectoryWriter(out, parquet=False) as writer:
        for traj in trajectories:
            writer.write(traj)
    return out
