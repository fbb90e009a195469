"""``benchmarks/run_all.py`` (``make bench``): parsing the benchmarks' outputs, the plots, the report.

The full run takes minutes; here the report is re-rendered from the committed one (``--reuse``)
and one real, fast benchmark is run through the whole path."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("run_all", ROOT / "benchmarks" / "run_all.py")
run_all = importlib.util.module_from_spec(_spec)
sys.modules["run_all"] = run_all  # dataclasses look their module up while the class is made
_spec.loader.exec_module(run_all)

PNG = b"\x89PNG\r\n\x1a\n"


def images(markdown: str, base: Path) -> list[Path]:
    return [base / m for m in re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", markdown)]


def test_latency_lines_of_every_format():
    text = """retrieve 1 query (ours)      p50_ms=0.1877  p99_ms=0.3431
  docker exec CLI (baseline)                   p50     60.9 ms   p99     67.9 ms
site reset forum   : p50 0.4 ms  p99 0.7 ms  (restore the SQLite file)
web-shop-v0        expert: mean reward 1.000  success 100%  episodes 6  steps 18  step p50 252.5 ms  p99 429.3 ms
tool calls via env.step: p50 0.49 ms, p95 0.62 ms over 657 calls
search_flights         p50   0.49 ms  n=61"""
    assert run_all.latencies("b", text) == [
        ("b: retrieve 1 query (ours)", 0.1877, 0.3431),
        ("b: docker exec CLI (baseline)", 60.9, 67.9),
        ("b: site reset forum", 0.4, 0.7),
        ("b: web-shop-v0 expert step", 252.5, 429.3),
    ]  # lines without a p99 are not latency distributions and are left out


@given(
    label=st.from_regex(r"[a-z][a-z0-9 ()+-]{0,30}[a-z)]", fullmatch=True),
    p50=st.floats(0.001, 1e5),
    spread=st.floats(1.0, 100.0),
    style=st.sampled_from(["{l}   p50 {a:.4g} ms   p99 {b:.4g} ms", "{l}  p50_ms={a:.4g}  p99_ms={b:.4g}"]),
)
def test_latency_parser_round_trips(label, p50, spread, style):
    line = style.format(l=label, a=p50, b=p50 * spread)
    [(got_label, a, b)] = run_all.latencies("x", line)
    assert got_label == f"x: {' '.join(label.split())}"[:60]
    assert a == pytest.approx(float(f"{p50:.4g}")) and b == pytest.approx(float(f"{p50 * spread:.4g}"))


def test_tournament_table_and_concurrency_series():
    table = """noise sd 0.3, position bias 0.2, 100 trials per size
  N topology             tau(truth)    ±se  tau(RR)  top-1  matches   vs RR
  8 single_elimination        0.670  0.016    0.679   0.62     14.0   0.50x
 16 round_robin               0.880  0.005    1.000   0.59    120.0   1.00x"""
    rows = run_all.tournament(table)
    assert [(r["n"], r["topology"], r["tau"], r["se"], r["matches"]) for r in rows] == [
        (8, "single_elimination", 0.67, 0.016, 14.0),
        (16, "round_robin", 0.88, 0.005, 120.0),
    ]
    curves = run_all.throughput_curves(
        {
            "web_sites": "   1 concurrent episodes:    3.9 steps/s (1.00x of 1)\n"
            "   2 concurrent episodes:    4.4 steps/s (1.13x of 1)",
            "swe_docker": "  1 env at a time (baseline):   63.6 episodes/min (3.8s)\n"
            "  8 concurrent envs:            96.3 episodes/min (2.5s)  (1.51x)",
            "scale": "     0  1 actors   114.56    386.6      0.27       1.00 0\n"
            "     0  2 actors   111.92    377.7      0.27       0.98 0",
            "web_miniwob": "expert episodes/s, 1 context(s)        1.59 /s   (8/8 solved)",  # one point: no curve
        }
    )
    assert curves == {
        "web_sites: concurrent episodes (steps/s)": [(1, 3.9), (2, 4.4)],
        "swe_docker: concurrent envs (episodes/min)": [(1, 63.6), (8, 96.3)],
        "scale: Ray env actors, 0 ms env CPU/call (traj/s)": [(1, 114.56), (2, 111.92)],
    }


def test_ratios_against_in_run_baselines():
    text = """  docker SDK exec_run     p50  46.2 ms  p99  51.9 ms  (1.3x faster than baseline)
retrieve 1 query (bm25s)     p50_ms=2.459  p99_ms=3.059  speedup=13.1
screenshot 1280x720 viewport         p50    33.8 ms   (n=20)
index build (bm25s api)      seconds=2.024  ratio_ours_vs_bm25s=1.081"""
    assert [x for _, x in run_all.ratios("b", text)] == [1.3, 13.1, 1.081]  # "1280x720" is no ratio
    long = "build 1.99 s wall " + "x" * 200 + " -> build/open CPU = 2.6x"
    [(line, x)] = run_all.ratios("b", long)
    assert x == 2.6 and len(line) < 125 and line.endswith("= 2.6x")
    load = '{"args": {"search": 32}, "ratios_vs_c1": {"throughput": 0.86, "p99_step": 88.9}}'
    assert [x for _, x in run_all.ratios("reliability_load", load)] == [0.86, 88.9]
    assert run_all.ratios("credit_tournament", "  8 anchor  0.654  0.018  0.671  0.57  7.0  0.25x") == []


def test_reuse_rerenders_the_committed_report_with_plots(tmp_path):
    committed = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    out = tmp_path / "results.md"
    run_all.main(["--reuse", str(ROOT / "docs" / "results.md"), "--out", str(out)])
    text = out.read_text(encoding="utf-8")
    sections = lambda md: re.findall(r"^## (\S+)$", md, re.M)  # noqa: E731
    assert [s for s in sections(text) if s != "Plots"] == [s for s in sections(committed) if s != "Plots"]
    for name, _, body in run_all._SECTION.findall(committed):  # every output is kept verbatim
        assert body in text, name
    assert "## Ratios against the in-run baselines" in text
    pngs = images(text, out.parent)
    assert {p.name for p in pngs} == {"latency.png", "throughput.png", "tournament.png", "rollout_memory.png"}
    for p in pngs:
        assert p.parent == tmp_path / "results" and p.read_bytes()[:8] == PNG and p.stat().st_size > 10_000


def test_one_real_benchmark_through_the_whole_path(tmp_path):
    out = tmp_path / "docs" / "results.md"
    out.parent.mkdir()
    run_all.main(["--only", "credit_tournament", "--out", str(out), "--plots-dir", str(tmp_path / "plots")])
    text = out.read_text(encoding="utf-8")
    assert re.search(r"^\| credit_tournament \| `--trials 100` \| 0 \| \d+ \|$", text, re.M)
    assert "load average (1 / 5 / 15 min) before the run" in text and "## GPU runs" in text
    [plot] = images(text, out.parent)
    assert plot.resolve() == (tmp_path / "plots" / "tournament.png").resolve()
    assert plot.read_bytes()[:8] == PNG


def test_failed_benchmarks_are_reported_but_not_plotted(tmp_path):
    ok = run_all.Result(
        "scale", [], 0, 1.0, "     25  1 actors   8.63    29.1\n     25  2 actors   15.50    52.3"
    )
    failed = run_all.Result(
        "web_sites", [], 1, 1.0, "   1 concurrent episodes:    3.9 steps/s\n[stderr]\nboom"
    )
    plots = run_all.make_plots([ok, failed], tmp_path, "2 logical cores")
    assert [p.file for p in plots] == ["throughput.png"]
    text = run_all.render(["- machine"], [ok, failed], plots, "plots")
    assert "| web_sites | `` | 1 | 1 |" in text and "boom" in text


def test_reuse_of_a_file_that_is_no_report_is_a_clear_error(tmp_path):
    bogus = tmp_path / "notes.md"
    bogus.write_text("# some notes\n\nno benchmark sections here\n")
    with pytest.raises(SystemExit, match="no benchmark sections found"):
        run_all.main(["--reuse", str(bogus), "--out", str(tmp_path / "r.md")])


def test_the_report_carries_the_reliability_summary_table(tmp_path):
    doc = tmp_path / "reliability.md"
    doc.write_text(
        "# Reliability\n\nintro\n\n## Summary\n\nText first.\n\n| a | b |\n| --- | --- |\n| 1 | 2 |\n\n"
        "| other | table |\n\n## Bugs\n\n| x | y |\n"
    )
    assert run_all.reliability_table(doc) == ["| a | b |", "| --- | --- |", "| 1 | 2 |"]
    assert run_all.reliability_table(tmp_path / "missing.md") == []
    report = run_all.render([], [], [], "results")
    assert "## Reliability suite" in report and "| Part | Attack or fault |" in report
