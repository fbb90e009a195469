"""Every TravelPlanner check on hand-built plans that pass it and plans that fail it."""

from __future__ import annotations

import copy

import pytest

from turngym.envs.travel.evaluate import COMMONSENSE, aggregate_metrics, evaluate_plan
from turngym.envs.travel.models import Query

F100 = "Flight Number: F100, from Home to Alpha, Departure Time: 08:00, Arrival Time: 10:00"
F101 = "Flight Number: F101, from Alpha to Home, Departure Time: 09:00, Arrival Time: 11:00"


def query(**kw) -> Query:
    base = dict(
        org="Home",
        dest="Alpha",
        days=3,
        visiting_city_number=1,
        date=["2022-03-01", "2022-03-02", "2022-03-03"],
        people_number=2,
        budget=2000,
        level="easy",
    )
    base.update(kw)
    return Query.model_validate(base)


def plan3() -> list[dict]:
    return [
        {
            "days": 1,
            "current_city": "from Home to Alpha",
            "transportation": F100,
            "breakfast": "-",
            "attraction": "Alpha Museum, Alpha;",
            "lunch": "-",
            "dinner": "Dragon Bowl, Alpha",
            "accommodation": "Sunny loft, Alpha",
        },
        {
            "days": 2,
            "current_city": "Alpha",
            "transportation": "-",
            "breakfast": "Taco Stand, Alpha",
            "attraction": "Alpha Park, Alpha;",
            "lunch": "Curry Corner, Alpha",
            "dinner": "Pasta Place, Alpha",
            "accommodation": "Sunny loft, Alpha",
        },
        {
            "days": 3,
            "current_city": "from Alpha to Home",
            "transportation": F101,
            "breakfast": "-",
            "attraction": "-",
            "lunch": "-",
            "dinner": "-",
            "accommodation": "-",
        },
    ]


def edited(**changes) -> list[dict]:
    """plan3 with ``changes`` = {"<day>_<field>": value or None (delete the key)}."""
    plan = copy.deepcopy(plan3())
    for key, value in changes.items():
        day, field = key.split("_", 1)
        if value is None:
            del plan[int(day[1:]) - 1][field]
        else:
            plan[int(day[1:]) - 1][field] = value
    return plan


def test_base_plan_passes_everything(tiny_db):
    ev = evaluate_plan(query(), plan3(), tiny_db)
    assert ev.delivered and ev.final_pass, ev.failures()
    assert set(ev.commonsense) == set(COMMONSENSE)
    # flights 2*(200+250) + meals 2*(15+10+25+20) + loft 100*ceil(2/4)*2 nights
    assert ev.total_cost == 900 + 140 + 200
    assert ev.hard == {
        "budget": (True, None),
        "room_rule": (None, None),
        "cuisine": (None, None),
        "room_type": (None, None),
        "transportation": (None, None),
    }
    comps = ev.components()
    assert comps["pass"] == 1.0 and comps["hard.budget"] == 1.0 and "hard.cuisine" not in comps


@pytest.mark.parametrize(
    "check,plan",
    [
        (
            "reasonable_city_route",
            edited(
                d3_current_city="from Alpha to Beta",
                d3_transportation="Flight Number: F102, from Alpha to Beta",
            ),
        ),
        ("reasonable_city_route", edited(d1_current_city="from Beta to Alpha")),
        ("diverse_restaurants", edited(d2_lunch="Dragon Bowl, Alpha")),
        ("diverse_attractions", edited(d2_attraction="Alpha Park, Alpha;Alpha Museum, Alpha;")),
        (
            "non_conflicting_transportation",
            edited(d3_transportation="Self-driving, from Alpha to Home, cost: 25"),
        ),
        ("non_conflicting_transportation", edited(d1_transportation="-")),
        ("within_current_city", edited(d2_breakfast="Bistro Beta, Beta")),
        ("within_current_city", edited(d1_accommodation="Beta house, Beta")),
        ("within_sandbox", edited(d2_lunch="Ghost Kitchen, Alpha")),
        ("within_sandbox", edited(d1_transportation=F100.replace("F100", "F999"))),
        ("within_sandbox", edited(d1_attraction="Alpha Castle, Alpha;")),
        ("within_sandbox", edited(d1_transportation="Bus, from Home to Alpha")),
        (
            "minimum_nights",
            edited(d1_accommodation="Long stay flat, Alpha", d2_accommodation="Long stay flat, Alpha"),
        ),
        ("complete_information", edited(d2_lunch=None)),
        ("complete_information", edited(d2_lunch="-")),
        ("complete_information", edited(d2_attraction="-")),
        ("complete_information", edited(d1_accommodation="-")),
        ("complete_information", plan3()[:2]),
    ],
)
def test_each_commonsense_check_fails_on_its_defect(tiny_db, check, plan):
    ev = evaluate_plan(query(), plan, tiny_db)
    assert ev.commonsense[check][0] is False, ev.commonsense
    assert ev.commonsense[check][1]  # a reason for the model to read
    assert not ev.final_pass


def test_hard_checks_only_run_on_complete_in_sandbox_plans(tiny_db):
    assert evaluate_plan(query(), edited(d2_lunch=None), tiny_db).hard is None
    assert evaluate_plan(query(), edited(d2_lunch="Ghost Kitchen, Alpha"), tiny_db).hard is None
    assert evaluate_plan(query(), edited(d2_lunch="Dragon Bowl, Alpha"), tiny_db).hard is not None


def test_undelivered_plan(tiny_db):
    for plan in (None, []):
        ev = evaluate_plan(query(), plan, tiny_db)
        assert not ev.delivered and not ev.final_pass and ev.hard is None
        assert ev.components()["pass"] == 0.0


@pytest.mark.parametrize(
    "constraint,value,passes",
    [
        ("house rule", "pets", True),
        ("house rule", "smoking", False),
        ("house rule", "parities", True),  # TravelPlanner's spelling of "parties"; the loft allows parties
        ("cuisine", ["Italian", "Chinese"], True),
        ("cuisine", ["French"], False),
        ("room type", "entire room", True),
        ("room type", "not shared room", True),
        ("room type", "private room", False),
        ("room type", "shared room", False),
        ("transportation", "no self-driving", True),
        ("transportation", "no flight", False),
    ],
)
def test_hard_constraints(tiny_db, constraint, value, passes):
    q = query(local_constraint={constraint: value}, level="medium")
    ev = evaluate_plan(q, plan3(), tiny_db)
    key = {"house rule": "room_rule", "room type": "room_type"}.get(constraint, constraint)
    assert ev.hard[key][0] is passes
    assert ev.final_pass is passes


def test_budget(tiny_db):
    assert evaluate_plan(query(budget=1240), plan3(), tiny_db).hard["budget"][0] is True
    ev = evaluate_plan(query(budget=1239), plan3(), tiny_db)
    assert ev.hard["budget"][0] is False and "1240" in ev.hard["budget"][1]


def test_people_multipliers(tiny_db):
    # 5 people: flights x5, meals x5, loft ceil(5/4)=2 units per night
    ev = evaluate_plan(query(people_number=5, budget=99999), plan3(), tiny_db)
    assert ev.total_cost == 5 * 450 + 5 * 70 + 2 * 100 * 2
    drive = edited(
        d1_transportation="Self-driving, from Home to Alpha, Duration: 5 hours, Distance: 500 km, Cost: 25",
        d3_transportation="Self-driving, from Alpha to Home, Duration: 5 hours, Distance: 500 km, Cost: 25",
    )
    ev = evaluate_plan(query(people_number=6, budget=99999), drive, tiny_db)
    assert ev.final_pass, ev.failures()
    assert ev.total_cost == 2 * 25 * 2 + 6 * 70 + 2 * 100 * 2  # ceil(6/5)=2 cars per leg


def test_cuisine_ignores_meals_in_the_origin_city(tiny_db):
    plan = edited(d3_dinner="Home Cafe, Home")
    q = query(local_constraint={"cuisine": ["Mediterranean"]}, level="medium")
    ev = evaluate_plan(q, plan, tiny_db)
    assert ev.commonsense["within_current_city"][0] is True
    assert ev.hard["cuisine"][0] is False


def test_road_leg_of_a_day_or_more_is_not_in_the_sandbox(tiny_db):
    plan = edited(d3_transportation="Taxi, from Alpha to Home")
    assert evaluate_plan(query(), plan, tiny_db).commonsense["within_sandbox"][0] is True
    q = query(dest="State S", days=5, visiting_city_number=2, date=[f"2022-03-0{i}" for i in range(1, 6)])
    assert tiny_db.road("Beta", "Home", "taxi")["cost"] is None
    five = multi_city_plan()
    five[4]["transportation"] = "Taxi, from Beta to Home"
    assert evaluate_plan(q, five, tiny_db).commonsense["within_sandbox"][0] is False


def test_strict_flags_fixed_loopholes_but_lenient_mode_matches_travelplanner(tiny_db):
    shifted = query(date=["2022-03-02", "2022-03-03", "2022-03-04"])  # F100 flies on 03-01
    assert evaluate_plan(shifted, plan3(), tiny_db).commonsense["within_sandbox"][0] is False
    assert evaluate_plan(shifted, plan3(), tiny_db, strict=False).commonsense["within_sandbox"][0] is True
    bus = edited(d1_transportation="Bus, from Home to Alpha")
    assert evaluate_plan(query(), bus, tiny_db, strict=False).commonsense["within_sandbox"][0] is True


def multi_city_plan() -> list[dict]:
    return plan3()[:2] + [
        {
            "days": 3,
            "current_city": "from Alpha to Beta",
            "transportation": "Flight Number: F102, from Alpha to Beta",
            "breakfast": "-",
            "attraction": "Beta Zoo, Beta;",
            "lunch": "-",
            "dinner": "Bistro Beta, Beta",
            "accommodation": "Beta house, Beta",
        },
        {
            "days": 4,
            "current_city": "Beta",
            "transportation": "-",
            "breakfast": "Beta Diner, Beta",
            "attraction": "Beta Tower, Beta;",
            "lunch": "Beta Grill, Beta",
            "dinner": "Beta Noodles, Beta",
            "accommodation": "Beta house, Beta",
        },
        {
            "days": 5,
            "current_city": "from Beta to Home",
            "transportation": "Flight Number: F103, from Beta to Home",
            "breakfast": "-",
            "attraction": "-",
            "lunch": "-",
            "dinner": "-",
            "accommodation": "-",
        },
    ]


def test_multi_city_trip_in_a_state(tiny_db):
    q = query(
        dest="State S",
        days=5,
        visiting_city_number=2,
        date=[f"2022-03-0{i}" for i in range(1, 6)],
        budget=5000,
    )
    ev = evaluate_plan(q, multi_city_plan(), tiny_db)
    assert ev.final_pass, ev.failures()
    wrong_state = evaluate_plan(q.model_copy(update={"dest": "State H"}), multi_city_plan(), tiny_db)
    assert wrong_state.commonsense["reasonable_city_route"][0] is False
    three = evaluate_plan(q.model_copy(update={"visiting_city_number": 3}), multi_city_plan(), tiny_db)
    assert three.commonsense["complete_information"][0] is False
    revisit = multi_city_plan()
    revisit[3]["current_city"] = "Alpha"  # Alpha, Alpha->Beta, Alpha: a city left and re-entered
    assert evaluate_plan(q, revisit, tiny_db).commonsense["reasonable_city_route"][0] is False


def test_aggregate_metrics_follow_travelplanner(tiny_db):
    q_easy = query()
    q_med = query(level="medium", local_constraint={"house rule": "smoking"})
    q_none = query(
        level="hard",
        local_constraint={"room type": "entire room", "transportation": "no flight", "cuisine": ["Chinese"]},
    )
    results = [
        (q_easy, evaluate_plan(q_easy, plan3(), tiny_db)),  # all pass
        (q_med, evaluate_plan(q_med, plan3(), tiny_db)),  # room rule fails
        (q_none, evaluate_plan(q_none, None, tiny_db)),  # not delivered
    ]
    m = aggregate_metrics(results)
    assert m["n"] == 3
    assert m["delivery_rate"] == pytest.approx(2 / 3)
    assert m["commonsense_micro"] == pytest.approx(16 / 24)
    assert m["commonsense_macro"] == pytest.approx(2 / 3)
    # hard constraints set: 1 + 2 + 4 = 7; passed: budget x2
    assert m["hard_micro"] == pytest.approx(2 / 7)
    assert m["hard_macro"] == pytest.approx(1 / 3)
    assert m["final_pass_rate"] == pytest.approx(1 / 3)
    assert m["final_pass_by_level"] == {"easy": 1.0, "hard": 0.0, "medium": 0.0}
    with pytest.raises(ValueError):
        aggregate_metrics([])
