"""Property tests (hypothesis) for plan parsing and the plan checks."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turngym.envs.travel.evaluate import (
    COMMONSENSE,
    HARD,
    _valid_city_sequence,
    aggregate_metrics,
    evaluate_plan,
)
from turngym.envs.travel.models import PLAN_FIELDS, PlanError, parse_plan
from turngym.envs.travel.parsing import from_to, name_city, parse_leg, split_attractions
from turngym.envs.travel.queries import sample_task

SETTINGS = settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
word = (
    st.text(
        alphabet=st.characters(whitelist_categories=("Lu", "Ll", "Nd"), whitelist_characters=" '&-"),
        min_size=1,
        max_size=20,
    )
    .map(str.strip)
    .filter(bool)
)
city = word.filter(lambda w: " to " not in f" {w} " and "from" not in w)


@given(name=word, c=city)
def test_name_city_round_trip(name, c):
    assert name_city(f"{name}, {c}") == (name, c)
    assert name_city(f"{name}, {c}(Some State)") == (name, c)


@given(a=city, b=city)
def test_from_to_round_trip(a, b):
    assert from_to(f"from {a} to {b}") == (a, b)
    assert from_to(f"Flight Number: F1, from {a} to {b}, Departure Time: 08:00") == (a, b)
    leg = parse_leg(f"Flight Number: F77, from {a} to {b}, Departure Time: 08:00")
    assert (leg.mode, leg.origin, leg.destination, leg.flight_number) == ("Flight", a, b, "F77")


@given(items=st.lists(word.filter(lambda w: ";" not in w), max_size=5), trailing=st.booleans())
def test_split_attractions(items, trailing):
    text = ";".join(items) + (";" if trailing and items else "")
    assert split_attractions(text) == items


@given(
    st.lists(st.sampled_from("ABCDE"), min_size=1, max_size=4, unique=True),
    st.lists(st.integers(2, 4), min_size=4, max_size=4),
)
def test_valid_city_sequences(stops, stays):
    """home, each stop for 2+ consecutive entries, home: always valid; re-entering a stop never is."""
    seq = ["H"] + [s for s, n in zip(stops, stays, strict=False) for _ in range(n)] + ["H"]
    assert _valid_city_sequence(seq)
    if len(stops) >= 2:
        assert not _valid_city_sequence(seq[:-1] + [stops[0], stops[0], "H"])


fields = st.one_of(st.none(), st.just("-"), st.just(""), word, st.integers(-5, 5))
day_dict = st.fixed_dictionaries({}, optional={f: fields for f in PLAN_FIELDS})


@pytest.fixture(scope="module")
def task(small_db):
    return sample_task(small_db, np.random.default_rng(21), level="hard", days=5)


@SETTINGS
@given(days=st.lists(day_dict, min_size=1, max_size=9))
def test_evaluator_never_raises_on_arbitrary_plans(small_db, task, days):
    plan = parse_plan(days)
    ev = evaluate_plan(task.query, plan, small_db)
    assert ev.delivered and set(ev.commonsense) == set(COMMONSENSE)
    for ok, why in ev.commonsense.values():
        assert ok in (True, False) and (ok or why)
    if ev.hard is not None:
        assert ev.commonsense["complete_information"][0] and ev.commonsense["within_sandbox"][0]
        assert set(ev.hard) == set(HARD)
    assert not ev.final_pass  # random text is never a valid trip
    assert set(ev.components()) >= {"pass", *(f"cs.{c}" for c in COMMONSENSE)}


@given(
    st.one_of(st.text(max_size=30), st.integers(), st.none(), st.lists(st.integers(), min_size=1, max_size=3))
)
def test_parse_plan_rejects_non_plans_with_a_message(obj):
    try:
        plan = parse_plan(obj)
    except PlanError as e:
        assert str(e)
    else:
        assert plan  # only well-formed JSON lists of day objects get through


MEAL_OR_PLACE = ("breakfast", "lunch", "dinner", "accommodation")


@SETTINGS
@given(data=st.data())
def test_single_edits_of_a_valid_plan_break_the_matching_check(small_db, task, data):
    plan = [d.unit() for d in task.plan]
    assert evaluate_plan(task.query, plan, small_db).final_pass
    edit = data.draw(
        st.sampled_from(["drop_field", "duplicate_meal", "ghost_place", "over_budget", "drop_day"])
    )
    bad = copy.deepcopy(plan)
    q = task.query
    if edit == "drop_field":
        day = data.draw(st.integers(0, len(bad) - 1))
        field = data.draw(
            st.sampled_from(["transportation", "breakfast", "lunch", "dinner", "attraction", "accommodation"])
        )
        del bad[day][field]
        expect = "complete_information"
    elif edit == "duplicate_meal":
        meals = [(i, m) for i, d in enumerate(bad) for m in ("breakfast", "lunch", "dinner") if d[m] != "-"]
        (i1, m1), (i2, m2) = data.draw(st.lists(st.sampled_from(meals), min_size=2, max_size=2, unique=True))
        bad[i2][m2] = bad[i1][m1]
        expect = "diverse_restaurants"
    elif edit == "ghost_place":
        slots = [(i, m) for i, d in enumerate(bad) for m in MEAL_OR_PLACE if d[m] != "-"]
        i, m = data.draw(st.sampled_from(slots))
        bad[i][m] = "Zzyzx Phantom Place, " + bad[i][m].rsplit(", ", 1)[1]
        expect = "within_sandbox"
    elif edit == "over_budget":
        q = q.model_copy(update={"budget": float(data.draw(st.integers(0, int(task.cost) - 1)))})
        ev = evaluate_plan(q, bad, small_db)
        assert ev.hard["budget"][0] is False and not ev.final_pass
        return
    else:
        bad.pop(data.draw(st.integers(0, len(bad) - 1)))
        expect = "complete_information"
    ev = evaluate_plan(q, bad, small_db)
    assert ev.commonsense[expect][0] is False
    assert not ev.final_pass


@SETTINGS
@given(outcomes=st.lists(st.sampled_from(["pass", "budget", "none", "garbage"]), min_size=1, max_size=8))
def test_aggregate_metrics_bounds(small_db, task, outcomes):
    plan = [d.unit() for d in task.plan]
    results = []
    for o in outcomes:
        q = task.query if o != "budget" else task.query.model_copy(update={"budget": 0.0})
        p = {"pass": plan, "budget": plan, "none": None, "garbage": [{"days": 1, "current_city": "x"}]}[o]
        results.append((q, evaluate_plan(q, p, small_db)))
    m = aggregate_metrics(results)
    assert m["final_pass_rate"] == pytest.approx(outcomes.count("pass") / len(outcomes))
    assert m["delivery_rate"] == pytest.approx(1 - outcomes.count("none") / len(outcomes))
    for k in ("commonsense_micro", "commonsense_macro", "hard_micro", "hard_macro"):
        assert 0.0 <= m[k] <= 1.0
    assert m["final_pass_rate"] <= min(m["commonsense_macro"], m["hard_macro"])
    assert m["commonsense_macro"] <= m["delivery_rate"]
