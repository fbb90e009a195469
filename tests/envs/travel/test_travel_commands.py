"""The travel CLI commands and the scripted baselines."""

from __future__ import annotations

import csv
import json

import numpy as np
import typer
from typer.testing import CliRunner

from turngym.envs.travel import commands
from turngym.envs.travel.baselines import greedy_cheap, planner_actions, random_plan
from turngym.envs.travel.database import database_dir
from turngym.envs.travel.evaluate import evaluate_plan
from turngym.envs.travel.queries import sample_task


def app() -> typer.Typer:
    a = typer.Typer()
    for fn in (commands.travel_build_db, commands.travel_sample, commands.travel_eval):
        a.command(fn.__name__.replace("_", "-"))(fn)
    return a


def test_build_sample_and_eval_round_trip(tmp_path, small_db, cache_dir):
    runner = CliRunner()
    res = runner.invoke(
        app(),
        ["travel-build-db", "--seed", "7", "--n-cities", "40", "--n-days", "5", "--cache-dir", str(tmp_path)],
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["n_cities"] == 40
    folder = database_dir(3, 150, 14, cache_dir)  # the session's small database
    queries = tmp_path / "q.jsonl"
    res = runner.invoke(app(), ["travel-sample", str(queries), "--n", "6", "--db-path", str(folder)])
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in queries.read_text().splitlines()]
    assert [r["level"] for r in rows] == ["easy", "medium", "hard"] * 2
    plans = tmp_path / "plans.jsonl"
    lines = [json.dumps({"plan": r["annotated_plan"]}) for r in rows]
    lines[1] = json.dumps({"plan": None})
    lines[2] = json.dumps({"plan": "not json"})
    plans.write_text("\n".join(lines) + "\n")
    res = runner.invoke(app(), ["travel-eval", str(queries), str(plans), "--db-path", str(folder)])
    assert res.exit_code == 0, res.output
    metrics = json.loads(res.output[res.output.index("{") :])
    assert metrics["delivery_rate"] == 4 / 6 and metrics["final_pass_rate"] == 4 / 6
    # the same queries as a JSON list and as the dataset's CSV (Python-literal cells) score the same
    as_list = tmp_path / "q.json"
    as_list.write_text(json.dumps(rows, indent=2))
    as_csv = tmp_path / "q.csv"
    with as_csv.open("w", newline="") as fh:
        writer = csv.DictWriter(
            fh, fieldnames=[k for k in rows[0] if k != "annotated_plan"], extrasaction="ignore"
        )
        writer.writeheader()
        writer.writerows({k: str(v) if isinstance(v, list | dict) else v for k, v in r.items()} for r in rows)
    for path in (as_list, as_csv):
        res = runner.invoke(app(), ["travel-eval", str(path), str(plans), "--db-path", str(folder)])
        assert res.exit_code == 0, res.output
        assert json.loads(res.output[res.output.index("{") :]) == metrics
    as_list.write_text(json.dumps([rows[0], dict(rows[1], date="['2022-03-")]))
    res = runner.invoke(app(), ["travel-eval", str(as_list), str(plans)], terminal_width=300)
    flat = "".join(res.output.replace("│", "").split())  # the error box wraps lines
    assert (
        res.exit_code == 2
        and "q.json:record2:notaTravelPlannerquery:date:Valueerror,notaPythonlistliteral" in flat
    )
    plans.write_text(lines[0] + "\n")
    res = runner.invoke(app(), ["travel-eval", str(queries), str(plans), "--db-path", str(folder)])
    assert res.exit_code != 0 and "1 plans for 6 queries" in res.output


def test_greedy_baseline_solves_most_and_random_few(small_db):
    rng = np.random.default_rng(5)
    greedy = rand = 0
    n = 30
    for i in range(n):
        task = sample_task(small_db, rng, level=("easy", "medium", "hard")[i % 3])
        plan, searches = greedy_cheap(task.query, small_db)
        greedy += evaluate_plan(task.query, plan, small_db).final_pass
        assert searches  # it looked things up
        plan, _ = random_plan(task.query, small_db, rng)
        rand += evaluate_plan(task.query, plan, small_db).final_pass
    assert greedy >= 0.9 * n and rand <= 0.3 * n


def test_planner_actions_are_tool_calls(small_db):
    task = sample_task(small_db, np.random.default_rng(1), level="medium", days=5)
    actions = planner_actions("greedy", task.query, small_db, np.random.default_rng(0))
    calls = [json.loads(a.removeprefix("<tool_call>").removesuffix("</tool_call>")) for a in actions]
    assert calls[0]["name"] == "search_cities" and calls[-1]["name"] == "submit_plan"
    assert len(calls[-1]["arguments"]["plan"]) == 5
