"""Build a self-contained HTML report of a run (no server, no network, no external assets).

Per task, the group of trajectories side by side; per turn the assistant text, parsed tool
calls, observations (screenshots inline), reward components, per-method turn advantages and
token counts; filters by outcome; run-level plots (held-out eval and training reward and success
over steps, turns per episode, tool-error rate by turn index) rendered by matplotlib as inline SVG.
A tree rollout's group (turns with ``node_id``/``parent_id``, ``turngym.rollout.tree``) also gets
its tree drawn as inline SVG (``tree_view``): nodes with their value (the mean return of the
unmasked leaves below), edges parent -> child, the turn each branch point branched at.
A credit audit's directory (``audit.json``, ``turngym credit audit``) also gets its plots: each
method's rank correlation with A* (error bars) and its turn advantages against A*.
A training run's held-out before/after numbers (first and last ``eval/`` rows of ``metrics.jsonl``;
greedy, and the policy's own samples when the run logged ``eval/sampled/``) head the report
(``eval_summary``).

Advantages are read from ``turn.info["advantages"]`` (``{method: value}``) or from
``trajectory.metadata["advantages"]`` (``{method: [value per turn]}``). Training metrics are
read from ``metrics.jsonl`` in the run directory when present (one JSON object per step). A
training run directory (``trajectories/step-NNNNNN.jsonl``) is read step by step.
"""

from __future__ import annotations

import base64
import io
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from turngym.core.tree import TREE_ROOT, node_values
from turngym.core.types import Trajectory, Turn

TEMPLATE_DIR = Path(__file__).parent / "templates"


def outcome_of(t: Trajectory) -> str:
    if t.masked:
        return "masked"
    success = t.metrics.get("success")
    if success is None:
        success = float(t.total_reward > 0)
    return "success" if success > 0 else "failure"


def _turn_advantages(t: Trajectory, turn: Turn) -> dict[str, float]:
    out = {k: float(v) for k, v in (turn.info.get("advantages") or {}).items()}
    for method, values in (t.metadata.get("advantages") or {}).items():
        if isinstance(values, list) and turn.index < len(values):
            out.setdefault(method, float(values[turn.index]))
    return out


def _turn_view(t: Trajectory, turn: Turn) -> dict[str, Any]:
    gen = turn.gen_span[1] - turn.gen_span[0] if turn.gen_span else None
    obs = turn.obs_span[1] - turn.obs_span[0] if turn.obs_span else None
    return {
        "index": turn.index,
        "action": turn.action.content,
        "structured_calls": [c.model_dump() for c in turn.action.tool_calls],
        "calls": [
            {
                "name": r.name or "(parse)",
                "ok": r.ok,
                "error": r.error or "",
                "kind": r.error_kind or "",
                "s": r.elapsed_s,
            }
            for r in turn.tool_results
        ],
        "observations": [
            {
                "role": m.role,
                "name": m.name or "",
                "content": m.content,
                "images": [base64.b64encode(img).decode() for img in m.images],
            }
            for m in turn.observation
        ],
        "reward": turn.reward,
        "components": turn.reward_components,
        "advantages": _turn_advantages(t, turn),
        "invalid": turn.invalid_action,
        "error": turn.error,
        "gen_tokens": gen,
        "obs_tokens": obs,
        "state_key": turn.state_key or "",
        "timing": {k: float(v) for k, v in turn.timing.items()},
    }


def ledger_view(trajs: list[Trajectory]) -> list[tuple[str, float, float | None]]:
    """The time ledger of the trajectories: (phase, seconds summed, share of the top-level phases or
    None for a backend's part of ``generate``), phases with no time left out."""
    from turngym.rollout.ledger import PHASES, ledger_totals

    totals = ledger_totals(trajs)
    top = sum(totals.get(p, 0.0) for p in PHASES)
    rows: list[tuple[str, float, float | None]] = [
        (p, totals[p], totals[p] / top if top else None) for p in PHASES if totals.get(p)
    ]
    rows += [(k, v, None) for k, v in sorted(totals.items()) if k not in PHASES and v]
    return rows


TREE_DX, TREE_DY, TREE_PAD = 120, 30, 24


def tree_view(members: list[Trajectory]) -> dict[str, Any] | None:
    """The layout of a tree group for the report (None when no turn has a node id): ``nodes``
    (``id, x, y, value, leaves, label, title, masked, branch``), ``edges`` (``x1, y1, x2, y2``),
    ``width``/``height``. Depth = turn index + 1 (the root, the reset state, at depth 0); leaves are
    stacked in node-id order and a parent sits at the mean height of its children. ``value`` is the
    mean return of the unmasked leaves below (None if all are masked); a branch point says the turn
    it branched at and its number of children."""
    if not any(turn.node_id for t in members for turn in t.turns):
        return None
    info: dict[str, dict[str, Any]] = {TREE_ROOT: {"parent": None, "depth": 0, "title": "reset state"}}
    leaf_of: list[tuple[Trajectory, str]] = []
    for t in members:
        for turn in t.turns:
            if turn.node_id and turn.node_id not in info:
                snippet = turn.action.content.strip().replace("\n", " ")
                info[turn.node_id] = {
                    "parent": turn.parent_id or TREE_ROOT,
                    "depth": turn.index + 1,
                    "title": f"turn {turn.index} · r={turn.reward:.3g} · {snippet[:160]}",
                }
        leaf = str(t.metadata.get("tree_node") or (t.turns[-1].node_id if t.turns else "") or TREE_ROOT)
        if leaf not in info:  # a branch whose fork failed: a node without a turn
            parent = leaf.rsplit(".", 1)[0] if "." in leaf else TREE_ROOT
            depth = info.get(parent, {"depth": 0})["depth"] + 1
            info[leaf] = {"parent": parent, "depth": depth, "title": f"not started: {t.mask_reason}"}
        leaf_of.append((t, leaf))
    live = [(t, leaf) for t, leaf in leaf_of if not t.masked]
    paths = [[turn.node_id for turn in t.turns if turn.node_id] for t, _ in live]
    values = node_values(paths, [t.total_reward for t, _ in live]) if live else {}
    leaves_below: dict[str, int] = defaultdict(int)
    masked_leaf = {leaf for t, leaf in leaf_of if t.masked}
    for _, leaf in leaf_of:
        node = leaf
        while node is not None:
            leaves_below[node] += 1
            node = info[node]["parent"]
    children: dict[str, list[str]] = defaultdict(list)
    for node, d in info.items():
        if d["parent"] is not None:
            children[d["parent"]].append(node)

    def order(node: str) -> tuple[int, ...]:
        return tuple(int(p) for p in node.split(".")[1:] if p.isdigit())

    ys: dict[str, float] = {}
    next_y = [0]

    def place(node: str) -> float:
        kids = sorted(children.get(node, []), key=order)
        if not kids:
            ys[node] = float(next_y[0])
            next_y[0] += 1
        else:
            ys[node] = sum(place(k) for k in kids) / len(kids)
        return ys[node]

    place(TREE_ROOT)
    nodes = []
    for node, d in info.items():
        kids = children.get(node, [])
        value = values.get(node)
        x, y = TREE_PAD + d["depth"] * TREE_DX, TREE_PAD + ys[node] * TREE_DY
        branch = f"branch @ turn {d['depth']} ×{len(kids)}" if len(kids) >= 2 else ""
        title = f"{node} · value {'—' if value is None else f'{value:.3g}'} · {leaves_below[node]} leaves · {d['title']}"
        nodes.append(
            {
                "id": node,
                "x": x,
                "y": y,
                "value": value,
                "leaves": leaves_below[node],
                "label": "masked" if value is None else f"V={value:.2f}",
                "title": title + (f" · {branch}" if branch else ""),
                "masked": node in masked_leaf or value is None,
                "branch": branch,
            }
        )
    lo = min((n["value"] for n in nodes if n["value"] is not None), default=0.0)
    hi = max((n["value"] for n in nodes if n["value"] is not None), default=1.0)
    for n in nodes:  # red (lowest value) -> green (highest)
        f = 0.5 if n["value"] is None or hi == lo else (n["value"] - lo) / (hi - lo)
        n["color"] = "#bbbbbb" if n["value"] is None else f"hsl({int(120 * f)}, 60%, 45%)"
    pos = {n["id"]: (n["x"], n["y"]) for n in nodes}
    edges = [
        {"x1": pos[d["parent"]][0], "y1": pos[d["parent"]][1], "x2": pos[node][0], "y2": pos[node][1]}
        for node, d in info.items()
        if d["parent"] is not None
    ]
    depth = max(d["depth"] for d in info.values())
    return {
        "nodes": nodes,
        "edges": edges,
        "width": 2 * TREE_PAD + depth * TREE_DX + 80,
        "height": 2 * TREE_PAD + max(next_y[0] - 1, 0) * TREE_DY + 10,
        "leaves": len(leaf_of),
        "branch_points": sum(1 for n in nodes if n["branch"]),
    }


EVAL_KEYS = (
    "eval/reward/outcome",
    "eval/reward/success",
    "eval/sampled/reward/outcome",
    "eval/sampled/reward/success",
)
#: the held-out evals a training run logs (``Trainer.evaluate``): metric prefix -> its name in the summary
EVALS = {"eval/": "held-out success", "eval/sampled/": "held-out sampled success"}


def eval_summary(metrics: list[dict[str, Any]], prefix: str = "eval/") -> str | None:
    """``held-out success 0.12 (step 0) -> 0.47 (step 40); outcome ...; masked ...`` from the first and
    last metrics rows holding ``{prefix}reward/success`` (masked trajectories count as failures there);
    None without two such rows. ``prefix="eval/sampled/"``: the eval of the policy's own samples
    (k per task), whose line also says k and pass@k."""
    key = f"{prefix}reward/success"
    rows = [m for m in metrics if key in m]
    if len(rows) < 2:
        return None
    a, b = rows[0], rows[-1]
    sa, sb = a.get("step", 0), b.get("step", len(metrics))
    head = EVALS.get(prefix, f"{prefix} success")
    parts = [f"{head} {a[key]:.2f} (step {sa}) -> {b[key]:.2f} (step {sb})"]
    before = prefix.replace("eval/", "eval_before_sft/", 1) + "reward/success"
    pre = next((m for m in metrics if before in m), None)
    if pre is not None:  # the untrained policy, before the warm start
        parts[0] = f"{head} {pre[before]:.2f} (before training) -> " + parts[0][len(head) + 1 :]
    if f"{prefix}reward/outcome" in a and f"{prefix}reward/outcome" in b:
        parts.append(f"outcome {a[f'{prefix}reward/outcome']:+.3f} -> {b[f'{prefix}reward/outcome']:+.3f}")
    if f"{prefix}pass_at_k" in a and f"{prefix}pass_at_k" in b:
        n, tasks = b.get(f"{prefix}episodes"), b.get("eval/episodes")
        k = f"@{round(n / tasks)}" if n and tasks else "@k"
        parts.append(f"pass{k} {a[f'{prefix}pass_at_k']:.2f} -> {b[f'{prefix}pass_at_k']:.2f}")
    ma, mb = a.get(f"{prefix}reward/masked_frac", 0.0), b.get(f"{prefix}reward/masked_frac", 0.0)
    parts.append(f"masked {ma:.0%} -> {mb:.0%}")
    return "; ".join(parts)


def eval_summaries(metrics: list[dict[str, Any]]) -> list[str]:
    """The :func:`eval_summary` line of each held-out eval the run logged (greedy, then sampled)."""
    return [line for prefix in EVALS if (line := eval_summary(metrics, prefix))]


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg") :]


def _plots(trajs: list[Trajectory], metrics: list[dict[str, Any]]) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots: list[tuple[str, str]] = []
    steps = sorted({int(t.metadata.get("step", 0)) for t in trajs})
    if any(k in m for m in metrics for k in EVAL_KEYS):
        fig, ax = plt.subplots(figsize=(5, 3))
        for k, marker, style in zip(EVAL_KEYS, "osov", ("-", "-", "--", "--"), strict=True):
            pts = [(m.get("step", i), m[k]) for i, m in enumerate(metrics) if k in m]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker=marker, linestyle=style, label=k)
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
        title = "\n".join(line.replace("; ", "\n") for line in eval_summaries(metrics))
        ax.set_title(title or "held-out eval", fontsize=7)
        plots.append(("held-out eval", _svg(fig)))
        plt.close(fig)
    if metrics:
        xs = [m.get("step", i) for i, m in enumerate(metrics)]
        keys = [
            k
            for k in ("reward/outcome", "reward/total", "reward", "success", "outcome")
            if any(k in m for m in metrics)
        ]
        if keys:
            fig, ax = plt.subplots(figsize=(5, 3))
            for k in keys:
                ax.plot(xs, [m.get(k, float("nan")) for m in metrics], marker="o", label=k)
            ax.set_xlabel("step")
            ax.legend(fontsize=7)
            ax.set_title("training metrics")
            plots.append(("reward and success over steps", _svg(fig)))
            plt.close(fig)
    if not metrics or len(steps) > 1:
        by_step: dict[int, list[Trajectory]] = defaultdict(list)
        for t in trajs:
            by_step[int(t.metadata.get("step", 0))].append(t)
        xs = sorted(by_step)
        fig, ax = plt.subplots(figsize=(5, 3))
        ax.plot(
            xs,
            [sum(t.total_reward for t in by_step[s]) / len(by_step[s]) for s in xs],
            marker="o",
            label="mean return",
        )
        ax.plot(
            xs,
            [sum(outcome_of(t) == "success" for t in by_step[s]) / len(by_step[s]) for s in xs],
            marker="s",
            label="success rate",
        )
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
        ax.set_title("return and success by step")
        plots.append(("return and success by step", _svg(fig)))
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(5, 3))
    turns = [t.num_turns for t in trajs]
    ax.hist(turns, bins=range(0, max(turns, default=0) + 2), align="left", rwidth=0.8)
    ax.set_xlabel("turns per episode")
    ax.set_ylabel("episodes")
    ax.set_title("turns per episode")
    plots.append(("turns per episode", _svg(fig)))
    plt.close(fig)
    ledger = [(p, sec) for p, sec, share in ledger_view(trajs) if share is not None]
    if ledger:
        fig, ax = plt.subplots(figsize=(5, 3))
        ax.barh([p for p, _ in ledger][::-1], [sec for _, sec in ledger][::-1])
        ax.set_xlabel("seconds, summed over trajectories")
        ax.set_title("where the rollout time went")
        plots.append(("where the rollout time went", _svg(fig)))
        plt.close(fig)
    errors: dict[int, list[float]] = defaultdict(list)
    for t in trajs:
        for turn in t.turns:
            calls = turn.tool_results
            errors[turn.index].append(sum(not r.ok for r in calls) / len(calls) if calls else 0.0)
    if errors:
        xs = sorted(errors)
        fig, ax = plt.subplots(figsize=(5, 3))
        ax.bar(xs, [sum(errors[i]) / len(errors[i]) for i in xs])
        ax.set_xlabel("turn index")
        ax.set_ylabel("tool-error rate")
        ax.set_ylim(0, 1)
        ax.set_title("tool errors by turn")
        plots.append(("tool-error rate", _svg(fig)))
        plt.close(fig)
    return plots


def audit_plots(audit: dict[str, Any], trajs: list[Trajectory]) -> list[tuple[str, str]]:
    """A credit audit's plots (``audit.json`` of ``turngym credit audit``): each method's Spearman
    correlation with A* and its bootstrap error bar, and each method's turn advantage against A*."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots: list[tuple[str, str]] = []
    scored = {k: m for k, m in audit.get("methods", {}).items() if "error" not in m}
    rows = [(k, m["spearman"]) for k, m in scored.items() if m["spearman"]["value"] is not None]
    if rows:
        fig, ax = plt.subplots(figsize=(6, 0.4 * len(rows) + 1))
        ys = list(range(len(rows)))[::-1]
        ax.barh(ys, [r["value"] for _, r in rows], xerr=[r["se"] or 0.0 for _, r in rows], capsize=3)
        ax.set_yticks(ys, [k for k, _ in rows], fontsize=7)
        ax.axvline(0.0, color="grey", linewidth=0.8)
        ax.set_xlabel("Spearman with A* (± bootstrap s.e.)")
        ax.set_title(f"credit audit: {audit.get('env', '')}")
        plots.append(("credit audit: rank correlation with A*", _svg(fig)))
        plt.close(fig)
    pairs: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for t in trajs:
        for turn in t.turns:
            adv = turn.info.get("advantages", {})
            if "A*" in adv:
                for k in scored:
                    if k in adv:
                        pairs[k].append((adv["A*"], adv[k]))
    if pairs:
        cols = min(3, len(pairs))
        nrows = -(-len(pairs) // cols)
        fig, axes = plt.subplots(nrows, cols, figsize=(3 * cols, 2.6 * nrows), squeeze=False)
        for ax, (k, pts) in zip(axes.flat, sorted(pairs.items()), strict=False):
            ax.scatter(*zip(*pts, strict=True), s=6, alpha=0.6)
            ax.axhline(0.0, color="grey", linewidth=0.5)
            ax.axvline(0.0, color="grey", linewidth=0.5)
            ax.set_title(k[:40], fontsize=7)
            ax.set_xlabel("A*", fontsize=7)
        for ax in list(axes.flat)[len(pairs) :]:
            ax.axis("off")
        fig.tight_layout()
        plots.append(("credit audit: each method's advantage against A*", _svg(fig)))
        plt.close(fig)
    return plots


def build_report(
    trajs: list[Trajectory],
    title: str = "turngym run",
    metrics: list[dict[str, Any]] | None = None,
    audit: dict[str, Any] | None = None,
) -> str:
    """The report's HTML as a string."""
    import jinja2

    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        groups[t.group or t.task_id or "(no task)"].append(t)
    group_views = []
    for key, members in groups.items():
        members.sort(key=lambda t: t.sample)
        group_views.append(
            {
                "key": key,
                "task_id": members[0].task_id,
                "env_id": members[0].env_id,
                "prompt": [{"role": m.role, "content": m.content} for m in members[0].prompt],
                "reference": json.dumps(members[0].reference, default=str)[:2000],
                "tree": tree_view(members),
                "trajs": [
                    {
                        "sample": t.sample,
                        "outcome": outcome_of(t),
                        "total_reward": t.total_reward,
                        "num_turns": t.num_turns,
                        "mask_reason": t.mask_reason,
                        "n_tokens": len(t.token_ids),
                        "n_sampled": sum(t.loss_mask),
                        "status": "terminated"
                        if t.terminated
                        else "truncated"
                        if t.truncated
                        else "unfinished",
                        "turns": [_turn_view(t, turn) for turn in t.turns],
                    }
                    for t in members
                ],
            }
        )
    counts = defaultdict(int)
    for t in trajs:
        counts[outcome_of(t)] += 1
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATE_DIR), autoescape=True)
    return env.get_template("report.html.j2").render(
        title=title,
        groups=group_views,
        n=len(trajs),
        counts=dict(counts),
        ledger=[(p, share) for p, _, share in ledger_view(trajs) if share is not None],
        plots=(audit_plots(audit, trajs) if audit else []) + (_plots(trajs, metrics or []) if trajs else []),
    )


def write_report(run: str | Path, out: str | Path | None = None) -> Path:
    """Read a run directory (or a trajectories file) and write ``report.html`` (or ``out``)."""
    from turngym.rollout.store import load_trajectories

    run = Path(run)
    steps_dir = run / "trajectories"
    if run.is_dir() and steps_dir.is_dir() and not any(run.glob("trajectories.*")):
        trajs = []  # a training run: one JSONL file per step
        for path in sorted(steps_dir.glob("step-*.jsonl")):
            step = int(path.name.split("-")[1].split(".")[0])
            for t in load_trajectories(path):
                t.metadata.setdefault("step", step)
                trajs.append(t)
        if not trajs:
            raise FileNotFoundError(f"no step-*.jsonl trajectories in {steps_dir}")
    else:
        trajs = load_trajectories(run)
    from turngym.trainer.metrics import read_metric_rows

    metrics = read_metric_rows((run if run.is_dir() else run.parent) / "metrics.jsonl")  # torn lines skipped
    out = Path(out) if out is not None else (run if run.is_dir() else run.parent) / "report.html"
    title = f"turngym · {run.name}"
    for headline in eval_summaries(metrics):
        title += f" · {headline}"
    audit_path = (run if run.is_dir() else run.parent) / "audit.json"
    audit = json.loads(audit_path.read_text()) if audit_path.is_file() else None
    out.write_text(build_report(trajs, title=title, metrics=metrics, audit=audit), encoding="utf-8")
    return out
