"""Query sampling: every generated query is solvable, levels mean what TravelPlanner says."""

from __future__ import annotations

import json

import numpy as np
import pytest

from turngym.envs.travel.evaluate import evaluate_plan
from turngym.envs.travel.models import Query, load_queries_jsonl
from turngym.envs.travel.queries import InfeasibleError, open_request, sample_task


@pytest.mark.parametrize("level", ["easy", "medium", "hard"])
@pytest.mark.parametrize("days", [3, 5, 7])
def test_sampled_queries_are_solvable(small_db, level, days):
    rng = np.random.default_rng(100 + days)
    for _ in range(4):
        task = sample_task(small_db, rng, level=level, days=days)
        q = task.query
        ev = evaluate_plan(q, task.plan, small_db)
        assert ev.final_pass, ev.failures()
        assert q.level == level and q.days == days and len(task.plan) == days and len(q.date) == days
        assert q.visiting_city_number == {3: 1, 5: 2, 7: 3}[days]
        assert ev.total_cost == pytest.approx(task.cost) and task.cost <= q.budget
        assert q.budget % 100 == 0
        active = q.local_constraint.active()
        if level == "easy":
            assert q.people_number == 1 and active == []
        elif level == "medium":
            assert 2 <= q.people_number <= 8 and len(active) == 1 and "transportation" not in active
        else:
            assert 2 <= q.people_number <= 8 and len(active) == 3
        if days == 3:
            assert q.dest in small_db.city_state
        else:
            assert q.dest in small_db.state_cities and small_db.city_state[q.org] != q.dest
        assert q.org in q.query and f"{int(q.budget):,}" in q.query


def test_templates_vary_and_sampling_is_deterministic(small_db):
    texts = {sample_task(small_db, np.random.default_rng(s)).query.query.split(" ")[0] for s in range(30)}
    assert len(texts) >= 4
    a = sample_task(small_db, np.random.default_rng(7))
    b = sample_task(small_db, np.random.default_rng(7))
    assert a.query == b.query and a.plan == b.plan and a.searches == b.searches


def test_searches_cover_the_plan(small_db):
    task = sample_task(small_db, np.random.default_rng(3), level="hard", days=7)
    names = [n for n, _ in task.searches]
    assert names[0] == "search_cities"
    assert names.count("search_restaurants") == 3 and names.count("search_accommodations") == 3
    assert sum(n in ("search_flights", "distance") for n in names) == 4


def test_open_request_states_preferences(small_db):
    task = sample_task(small_db, np.random.default_rng(11), level="hard")
    text, prefs = open_request(task.query, np.random.default_rng(0))
    assert len(prefs) == 3 and all(p in text for p in prefs)
    assert "$" in text and task.query.org in text


def test_invalid_arguments(small_db):
    with pytest.raises(ValueError):
        sample_task(small_db, np.random.default_rng(0), level="extreme")
    with pytest.raises(ValueError):
        sample_task(small_db, np.random.default_rng(0), days=4)


def test_infeasible_world_raises(tiny_db):
    with pytest.raises(InfeasibleError):
        sample_task(tiny_db, np.random.default_rng(0), level="easy", days=7, max_tries=20)


def test_reads_travelplanner_query_jsonl(tmp_path):
    line = {
        "org": "Sarasota",
        "dest": "Chicago",
        "days": 3,
        "visiting_city_number": 1,
        "date": "['2022-03-22', '2022-03-23', '2022-03-24']",
        "people_number": 1,
        "local_constraint": "{'house rule': None, 'cuisine': None, 'room type': None, 'transportation': None}",
        "budget": 1900,
        "query": "Please plan a trip from Sarasota to Chicago ...",
        "level": "easy",
        "annotated_plan": "ignored",
        "reference_information": "ignored",
    }
    medium = dict(
        line,
        level="medium",
        local_constraint={
            "house rule": "parities",
            "cuisine": "Chinese",
            "room type": None,
            "transportation": None,
        },
    )
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps(line) + "\n\n" + json.dumps(medium) + "\n")
    qs = load_queries_jsonl(path)
    assert len(qs) == 2 and qs[0].date == ["2022-03-22", "2022-03-23", "2022-03-24"]
    assert qs[0].local_constraint.active() == []
    assert qs[1].local_constraint.house_rule == "parties" and qs[1].local_constraint.cuisine == ["Chinese"]
    round_trip = Query.model_validate(qs[1].to_travelplanner())
    assert round_trip == qs[1]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(dict(line, budget=-5)) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_queries_jsonl(bad)
    bad.write_text("{not json\n")
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_queries_jsonl(bad)
