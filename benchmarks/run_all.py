"""Run every CPU benchmark and write ``docs/results.md`` with plots under ``docs/results/`` (``make bench``).

Each script runs in its own process with the arguments below (sized so the whole run takes
minutes, not hours), and its output — which prints every number beside its in-run baseline — is
copied into the report verbatim, under a description of the machine (with the load average, since
the machine may be shared). The numbers the scripts print are then parsed (the parsers below know
each script's output format; ``reliability_load`` prints JSON) into matplotlib plots: latency
p50/p99, throughput against concurrency, tournament agreement against matches, rollout memory per
live trajectory. GPU numbers cannot be measured here; they are recorded by hand in
``benchmarks/gpu_results.md`` (card, command, numbers) and included as they are.

    python benchmarks/run_all.py [--only NAME ...] [--out docs/results.md] [--plots-dir docs/results]
    python benchmarks/run_all.py --reuse docs/results.md     # re-render report + plots, run nothing
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: script -> arguments for the report run (None: skipped; the script has no CPU mode worth running)
ARGS: dict[str, list[str] | None] = {
    "import_time.py": ["--repeats", "5"],
    "fork_cost.py": ["--forks", "200"],
    "rollout.py": ["all", "-n", "32", "-g", "4"],  # async: 128 trajectories through 32 slots
    "search_qa.py": ["--passages", "100000", "--questions", "1000", "--episodes", "200"],
    "travel_planner.py": ["--queries", "100"],
    "credit_tournament.py": ["--trials", "100"],
    "info_gain.py": ["--trajectories", "32", "--repeats", "3"],
    "ig_targets.py": ["--episodes", "10"],  # IGPO's gain per turn, answer vs per-hop targets (SmolLM2)
    "scale.py": ["--actors", "1", "2", "--tasks", "8", "--group", "2"],
    "swe_docker.py": ["--n", "10", "--episodes", "4"],
    "web_miniwob.py": ["--episodes", "8", "--steps", "16", "--concurrency", "2"],
    "web_sites.py": ["--episodes", "6", "--concurrency", "1,2"],
    "web_expert.py": ["--seeds", "2", "--gui-seeds", "1", "--concurrency", "2"],
    "reliability_load.py": ["--seconds", "60", "--swe", "1"],
    "attention_kernels.py": None,  # CUDA only; see gpu_results.md
    "train_curves.py": None,  # a GPU learning-curve run (device tool); see gpu_results.md
    "curves_report.py": None,  # packs such a run's directory into docs/ (needs the directory)
    "run_all.py": None,
}
TIMEOUT_S = 1200


@dataclass
class Result:
    """One benchmark script's run: what the report shows and the plots parse."""

    name: str
    args: list[str]
    rc: int
    seconds: float
    text: str


# ----------------------------------------------------------------------------- running
def machine() -> list[str]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem_kb = next(
            int(x.split()[1])
            for x in Path("/proc/meminfo").read_text().splitlines()
            if x.startswith("MemTotal")
        )
        mem = f"{mem_kb / 2**20:.1f} GiB"
    except (OSError, StopIteration):
        mem = "unknown"
    try:
        import torch

        torch_v = torch.__version__
    except ImportError:
        torch_v = "not installed"
    return [
        f"- CPU: {cpu}, {os.cpu_count()} logical cores; memory {mem}; no GPU",
        f"- {platform.platform()}; Python {platform.python_version()}; torch {torch_v}",
        f"- run at {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC",
    ]


def load_average() -> str:
    try:
        return " / ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def run(script: Path, args: list[str]) -> tuple[int, float, str]:
    start = time.perf_counter()
    try:
        out = subprocess.run(
            [sys.executable, str(script), *args], cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S
        )
        text, rc = (
            out.stdout + (f"\n[stderr]\n{out.stderr[-3000:]}" if out.returncode else ""),
            out.returncode,
        )
    except subprocess.TimeoutExpired as e:
        text, rc = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), 124
        text += f"\n[timed out after {TIMEOUT_S}s]"
    return rc, time.perf_counter() - start, text


def run_benchmarks(only: list[str] | None) -> tuple[list[str], list[Result]]:
    scripts = sorted(p for p in HERE.glob("*.py") if ARGS.get(p.name, []) is not None)
    if only:
        scripts = [p for p in scripts if p.stem in only]
    lines = [*machine(), f"- load average (1 / 5 / 15 min) before the run: {load_average()}"]
    results = []
    for script in scripts:
        args = ARGS.get(script.name) or []
        print(f"running {script.name} {' '.join(args)}", flush=True)
        rc, secs, text = run(script, args)
        results.append(Result(script.stem, args, rc, secs, text))
    lines.append(f"- load average after the run: {load_average()}")
    return lines, results


# ----------------------------------------------------------------------------- reading a report
_SECTION = re.compile(
    r"^## (\S+)\n\n`python benchmarks/\S+\.py ?([^`]*)`\n\n```text\n(.*?)\n```", re.M | re.S
)
_SUMMARY_ROW = re.compile(r"^\| (\S+) \| `[^`]*` \| (-?\d+) \| (\d+) \|$", re.M)


def read_report(text: str) -> tuple[list[str], list[Result]]:
    """The machine lines and benchmark results of a report this script wrote (for ``--reuse``)."""
    machine_block = re.search(r"^## Machine\n\n(.*?)\n\n", text, re.M | re.S)
    lines = machine_block.group(1).splitlines() if machine_block else []
    rows = {m.group(1): (int(m.group(2)), float(m.group(3))) for m in _SUMMARY_ROW.finditer(text)}
    results = []
    for m in _SECTION.finditer(text):
        rc, secs = rows.get(m.group(1), (0, 0.0))
        results.append(Result(m.group(1), m.group(2).split(), rc, secs, m.group(3)))
    return lines, results


# ----------------------------------------------------------------------------- parsing outputs
_NUM = r"([\d.]+(?:e[-+]?\d+)?)"
_P50 = re.compile(rf"\bp50(?:_ms)?[\s=:]+{_NUM}\s*(?:ms)?")
_P99 = re.compile(rf"\bp99(?:_ms)?[\s=:]+{_NUM}\s*(?:ms)?")


def latencies(name: str, text: str) -> list[tuple[str, float, float]]:
    """``(label, p50 ms, p99 ms)`` of every output line that reports both (``p50 X ms ... p99 Y ms``
    or ``p50_ms=X p99_ms=Y``); the label is the text before ``p50``, shortened."""
    out = []
    for line in text.splitlines():
        m50, m99 = _P50.search(line), _P99.search(line)
        if not (m50 and m99) or m99.start() < m50.start():
            continue
        label = line[: m50.start()].strip()
        if ":" in label:  # "web-shop-v0 expert: mean reward ... step" -> "web-shop-v0 expert step"
            head, _, rest = label.partition(":")
            words = rest.split()
            label = f"{head} {words[-1]}" if words and not re.fullmatch(r"[\d.%]+", words[-1]) else head
        label = re.sub(r"\s+", " ", label).strip(" ,:")
        out.append((f"{name}: {label}"[:60], float(m50.group(1)), float(m99.group(1))))
    return out


def tournament(text: str) -> list[dict]:
    """Rows of ``credit_tournament.py``'s table: N, topology, tau(truth), its se, tau(RR), top-1, matches."""
    rows = []
    pattern = re.compile(rf"^\s*(\d+) (\w+)\s+{_NUM}\s+{_NUM}\s+{_NUM}\s+{_NUM}\s+{_NUM}", re.M)
    for m in pattern.finditer(text):
        n, topo, tau, se, tau_rr, top1, matches = m.groups()
        rows.append(
            {
                "n": int(n),
                "topology": topo,
                "tau": float(tau),
                "se": float(se),
                "tau_rr": float(tau_rr),
                "top1": float(top1),
                "matches": float(matches),
            }
        )
    return rows


def throughput_curves(results: dict[str, str]) -> dict[str, list[tuple[int, float]]]:
    """Series ``label -> [(concurrency, throughput)]`` from the benchmarks that vary concurrency."""
    curves: dict[str, list[tuple[int, float]]] = {}
    text = results.get("scale", "")
    for m in re.finditer(rf"^\s*(\d+)\s+(\d+) actors\s+{_NUM}", text, re.M):
        curves.setdefault(f"scale: Ray env actors, {m.group(1)} ms env CPU/call (traj/s)", []).append(
            (int(m.group(2)), float(m.group(3)))
        )
    text = results.get("web_miniwob", "")
    for m in re.finditer(rf"expert episodes/s, (\d+) context\(s\)\s+{_NUM}", text):
        curves.setdefault("web_miniwob: browser contexts (episodes/s)", []).append(
            (int(m.group(1)), float(m.group(2)))
        )
    text = results.get("web_sites", "")
    for m in re.finditer(rf"(\d+) concurrent episodes:\s+{_NUM} steps/s", text):
        curves.setdefault("web_sites: concurrent episodes (steps/s)", []).append(
            (int(m.group(1)), float(m.group(2)))
        )
    text = results.get("swe_docker", "")
    for m in re.finditer(rf"(\d+) (?:env at a time|concurrent envs)[^:]*:\s+{_NUM} episodes/min", text):
        curves.setdefault("swe_docker: concurrent envs (episodes/min)", []).append(
            (int(m.group(1)), float(m.group(2)))
        )
    load = _json_block(results.get("reliability_load", ""))
    try:
        c1, cn = load["baseline_c1"], load["load"]["search_qa"]
        curves["reliability_load: search-qa trajectories in flight (traj/s)"] = [
            (1, c1["trajectories"] / c1["wall_s"]),
            (int(load["args"]["search"]), cn["traj_per_s"]),
        ]
    except (KeyError, TypeError, ZeroDivisionError):
        pass
    return {k: sorted(v) for k, v in curves.items() if len(v) >= 2}


_RATIO = re.compile(r"(?:\b(\d+(?:\.\d+)?)x\b|\b(?:speedup|ratio\w*)=(\d+(?:\.\d+)?))")


def ratios(name: str, text: str) -> list[tuple[str, float]]:
    """``(the output line, ratio)`` for every line that states a ratio against an in-run baseline
    (``1.3x faster than baseline``, ``speedup=13.1``, ``ratio_ours_vs_bm25s=1.081``, ...);
    ``reliability_load``'s JSON gives ``ratios_vs_c1``. Tables of ratios that are plotted
    (``credit_tournament``) are left out."""
    if name == "credit_tournament":
        return []
    if name == "reliability_load":
        data = (_json_block(text) or {}).get("ratios_vs_c1") or {}
        return [(f"{k} at full load vs 1 trajectory in flight", float(v)) for k, v in data.items()]
    out = []
    for line in text.splitlines():
        found = [float(a or b) for a, b in _RATIO.findall(line)]
        if found:
            line = re.sub(r"\s+", " ", line).strip()
            out.append((line if len(line) <= 120 else f"{line[:60]} … {line[-55:]}", found[-1]))
    return out


def rollout_memory(text: str) -> dict | None:
    """``rollout.py``'s ``memory {...}`` line (live trajectories and the bytes they hold)."""
    m = re.search(r"^memory (\{.*\})$", text, re.M)
    if not m:
        return None
    try:
        data = ast.literal_eval(m.group(1))
    except (ValueError, SyntaxError):
        return None
    return data if {"live_trajectories", "bytes"} <= set(data) else None


def _json_block(text: str) -> dict | None:
    start = text.find("{")
    if start < 0:
        return None
    try:
        return json.loads(text[start : text.rfind("}") + 1])
    except json.JSONDecodeError:
        return None


# ----------------------------------------------------------------------------- plots
@dataclass
class Plot:
    file: str
    title: str
    caption: str


def make_plots(results: list[Result], plots_dir: Path, cores: str) -> list[Plot]:
    """Draw every plot the results support into ``plots_dir``; the list of files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots_dir.mkdir(parents=True, exist_ok=True)
    texts = {r.name: r.text for r in results if r.rc == 0}
    made: list[Plot] = []

    def save(fig, ax, name: str, title: str, caption: str, *, axes: tuple[str, str, str], legend: int = 0):
        """Label the axes (x label, y label, heading), add the grid and legend, write the PNG."""
        ax.set_xlabel(axes[0])
        ax.set_ylabel(axes[1])
        ax.set_title(axes[2])
        ax.grid(alpha=0.3, **({"axis": "x"} if not axes[1] else {}))
        if legend:
            ax.legend(fontsize=legend)
        fig.tight_layout()
        fig.savefig(plots_dir / name, dpi=110)
        plt.close(fig)
        made.append(Plot(name, title, caption))

    lat = [row for name, text in texts.items() for row in latencies(name, text)]
    if lat:
        fig, ax = plt.subplots(figsize=(10, 0.28 * len(lat) + 1.4))
        names = sorted({label.split(":")[0] for label, _, _ in lat})
        colours = {n: plt.cm.tab10(i % 10) for i, n in enumerate(names)}
        y = list(range(len(lat)))[::-1]
        for yi, (label, p50, p99) in zip(y, lat, strict=True):
            c = colours[label.split(":")[0]]
            ax.barh(yi, p50, color=c, alpha=0.8)
            ax.plot([p50, p99], [yi, yi], color="black", lw=1)
            ax.plot(p99, yi, marker="|", color="black", ms=8)
        ax.set_yticks(y, [label for label, _, _ in lat], fontsize=7)
        ax.set_xscale("log")
        save(
            fig,
            ax,
            "latency.png",
            "Latency p50 / p99",
            "Every line of the outputs above that reports a p50 and a p99, by benchmark; the baselines "
            "measured in the same runs are included (their labels say *baseline* or name the bare library).",
            axes=(
                "milliseconds (bar: p50, whisker to p99; log scale)",
                "",
                "Latency of each measured operation",
            ),
        )

    curves = throughput_curves(texts)
    if curves:
        fig, ax = plt.subplots(figsize=(8, 4.6))
        for label, pts in curves.items():
            xs, ys = zip(*pts, strict=True)
            ax.plot(xs, [v / ys[0] for v in ys], marker="o", label=label)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        save(
            fig,
            ax,
            "throughput.png",
            "Throughput vs concurrency",
            "Each series is normalised to its own lowest-concurrency run (the in-run baseline). The machine "
            "is shared and has few cores, so CPU-bound series cannot scale far; I/O-bound ones show the "
            "overlap the async engine gets.",
            axes=(
                "concurrency (actors, contexts, episodes, envs or trajectories in flight)",
                "throughput relative to the lowest concurrency",
                f"Throughput vs concurrency ({cores})",
            ),
            legend=7,
        )

    rows = tournament(texts.get("credit_tournament", ""))
    if rows:
        fig, ax = plt.subplots(figsize=(7, 4.4))
        topologies = sorted({r["topology"] for r in rows})
        markers = {n: m for n, m in zip(sorted({r["n"] for r in rows}), "os^Dv", strict=False)}
        for i, topo in enumerate(topologies):
            for r in (r for r in rows if r["topology"] == topo):
                ax.errorbar(
                    r["matches"],
                    r["tau"],
                    yerr=r["se"],
                    marker=markers.get(r["n"], "o"),
                    color=plt.cm.tab10(i),
                    capsize=2,
                    label=f"{topo}" if r["n"] == min(markers) else None,
                )
        for n, m in markers.items():
            ax.plot([], [], marker=m, color="black", ls="", label=f"N = {n}")
        ax.set_xscale("log")
        save(
            fig,
            ax,
            "tournament.png",
            "Tournament Kendall tau vs matches",
            "`credit_tournament`: agreement of each topology's ranking with the truth (±1 standard error) "
            "against the number of pairwise judgements it costs; round-robin is the expensive reference.",
            axes=(
                "judge matches per group (log scale)",
                "Kendall tau vs the true ranking",
                "Arena tournaments: ranking quality vs judge cost",
            ),
            legend=7,
        )

    mem = rollout_memory(texts.get("rollout", ""))
    if mem:
        fig, ax = plt.subplots(figsize=(6, 4))
        xs, mb = mem["live_trajectories"], [b / 2**20 for b in mem["bytes"]]
        ax.plot(xs, mb, marker="o", label="measured")
        slope = mem.get("bytes_per_live_trajectory")
        if slope:
            ax.plot(
                xs, [x * slope / 2**20 for x in xs], ls="--", label=f"{slope / 1024:.0f} KiB per trajectory"
            )
        save(
            fig,
            ax,
            "rollout_memory.png",
            "Rollout memory per live trajectory",
            "`rollout.py memory`: bytes the engine holds with N trajectories in flight and the linear fit.",
            axes=("live trajectories", "MiB held by the engine", "Rollout engine memory"),
            legend=8,
        )
    return made


# ----------------------------------------------------------------------------- the report
def render(lines: list[str], results: list[Result], plots: list[Plot], plots_rel: str) -> str:
    parts = [
        "# Benchmark results",
        "",
        "Generated by `make bench` (`benchmarks/run_all.py`); do not edit by hand.",
        "",
        "## Machine",
        "",
        *lines,
        "",
        "## Summary",
        "",
        "| benchmark | arguments | exit | wall s |",
        "| --- | --- | --- | --- |",
        *(f"| {r.name} | `{' '.join(r.args)}` | {r.rc} | {r.seconds:.0f} |" for r in results),
        "",
    ]
    rows = [(r.name, line, x) for r in results if r.rc == 0 for line, x in ratios(r.name, r.text)]
    if rows:
        parts += [
            "## Ratios against the in-run baselines",
            "",
            "Every line of the outputs below that states a ratio (each benchmark measures its baseline in "
            "the same run, on the same loaded machine, so ratios are more stable than absolute numbers).",
            "",
            "| benchmark | output line | ratio |",
            "| --- | --- | --- |",
            *(f"| {name} | `{line.replace('|', '/')}` | {x:g} |" for name, line, x in rows),
            "",
        ]
    if plots:
        parts += ["## Plots", ""]
        for p in plots:
            parts += [f"### {p.title}", "", f"![{p.title}]({plots_rel}/{p.file})", "", p.caption, ""]
    for r in results:
        parts += [
            f"## {r.name}",
            "",
            f"`python benchmarks/{r.name}.py {' '.join(r.args)}`",
            "",
            "```text",
            r.text.rstrip(),
            "```",
            "",
        ]
    gpu = HERE / "gpu_results.md"
    if gpu.exists():
        parts += ["## GPU runs (device tool, recorded by hand)", "", gpu.read_text().strip(), ""]
    table = reliability_table(ROOT / "docs" / "reliability.md")
    if table:
        parts += [
            "## Reliability suite",
            "",
            "`pytest tests/reliability -m reliability` (part of `make test`); the summary table of",
            "[reliability.md](reliability.md), which has the bugs it found and the load benchmark.",
            "",
            *table,
            "",
        ]
    return "\n".join(parts) + "\n"


def reliability_table(path: Path) -> list[str]:
    """The first table under the ``## Summary`` heading of docs/reliability.md."""
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    start = next((k for k, line in enumerate(lines) if line.strip() == "## Summary"), None)
    if start is None:
        return []
    rows: list[str] = []
    for line in lines[start + 1 :]:
        if line.startswith("|"):
            rows.append(line)
        elif rows or line.startswith("## "):
            break
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", help="script names (without .py) to run")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results.md"))
    ap.add_argument("--plots-dir", help="where the PNGs go (default: <out dir>/results)")
    ap.add_argument(
        "--reuse", type=Path, help="re-render this report (and its plots) without running anything"
    )
    a = ap.parse_args(argv)
    out = Path(a.out)
    plots_dir = Path(a.plots_dir) if a.plots_dir else out.parent / "results"
    if a.reuse:
        lines, results = read_report(a.reuse.read_text(encoding="utf-8"))
        if not results:
            raise SystemExit(f"{a.reuse}: no benchmark sections found")
    else:
        lines, results = run_benchmarks(a.only)
    cores = next(
        (m.group(0) for line in lines if (m := re.search(r"\d+ logical cores", line))), "this machine"
    )
    try:
        plots = make_plots(results, plots_dir, cores)
    except ImportError:
        print("matplotlib is not installed (pip install 'turngym[viewer]'): no plots", file=sys.stderr)
        plots = []
    rel = os.path.relpath(plots_dir, out.parent)
    out.write_text(render(lines, results, plots, rel), encoding="utf-8")
    print(f"wrote {out} ({len(plots)} plots in {plots_dir})")


if __name__ == "__main__":
    main()
