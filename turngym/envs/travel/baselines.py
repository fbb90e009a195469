"""Scripted planners without privileged data, for contrast with the env's expert.

Both read the structured query (what a parser of the request text would produce) and use
only what the search tools return; ``planner_actions`` turns a planner into the tool calls
an agent would make (searches, then ``submit_plan``).

* ``greedy_cheap``: cities in the order ``search_cities`` lists them, the cheapest way to
  travel that the transportation constraint allows (flights/taxis, or self-driving), the
  cheapest stay allowed by minimum nights, room type and house rule, the cheapest unused
  restaurants (serving the required cuisines first) and the first unused attractions.
* ``random_plan``: random cities, random legs, stays, restaurants and attractions from the
  search results, ignoring every constraint.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from turngym.core.types import ToolCall
from turngym.envs.travel.database import TravelDB
from turngym.envs.travel.evaluate import HOUSE_RULE_TEXT, ROOM_TYPE_TEXT
from turngym.envs.travel.models import DayPlan, Query
from turngym.envs.travel.parsing import flight_text, road_text
from turngym.envs.travel.queries import layout_plan
from turngym.tools.parsers import get_parser

Planned = tuple[list[DayPlan] | None, list[tuple[str, dict[str, Any]]]]


def _route_dates(q: Query, n_stops: int) -> list[str]:
    return [q.date[min(2 * j, len(q.date) - 1)] for j in range(n_stops + 1)]


def _stop_options(q: Query, db: TravelDB) -> tuple[list[list[str]], list[tuple[str, dict[str, Any]]]]:
    if q.visiting_city_number == 1 and q.dest in db.city_state:
        return [[q.dest]], []
    pool = [c for c in db.state_cities.get(q.dest, []) if c != q.org]
    combos = itertools.islice(itertools.permutations(pool, q.visiting_city_number), 60)
    return [list(c) for c in combos], [("search_cities", {"state": q.dest})]


def _road_leg(db: TravelDB, o: str, d: str, mode: str, people: int) -> tuple[float, str] | None:
    road = db.road(o, d, mode)
    if road is None or road["cost"] is None:
        return None
    per = 5 if mode == "Self-driving" else 4
    return road["cost"] * math.ceil(people / per), road_text(
        mode, o, d, road["duration"], road["distance"], road["cost"]
    )


def _cheapest_legs(db: TravelDB, q: Query, route: list[str], dates: list[str]) -> list[str] | None:
    rule = q.local_constraint.transportation
    best: tuple[float, list[str]] | None = None
    for policy in ("air", "drive"):
        if (policy == "air" and rule == "no flight") or (policy == "drive" and rule == "no self-driving"):
            continue
        total, texts = 0.0, []
        for (o, d), date in zip(itertools.pairwise(route), dates, strict=True):
            options = []
            if policy == "drive":
                leg = _road_leg(db, o, d, "Self-driving", q.people_number)
                options += [leg] if leg else []
            else:
                if rule != "no flight":
                    options += [
                        (
                            f["Price"] * q.people_number,
                            flight_text(f["Flight Number"], o, d, f["DepTime"], f["ArrTime"]),
                        )
                        for f in db.flights(o, d, date)
                    ]
                leg = _road_leg(db, o, d, "Taxi", q.people_number)
                options += [leg] if leg else []
            if not options:
                break
            cost, text = min(options)
            total += cost
            texts.append(text)
        else:
            if best is None or total < best[0]:
                best = (total, texts)
    return None if best is None else best[1]


def _stay_ok(row: dict[str, Any], q: Query, nights: int) -> bool:
    lc = q.local_constraint
    if row["minimum nights"] > nights:
        return False
    if lc.house_rule and HOUSE_RULE_TEXT.get(lc.house_rule, "\0") in str(row["house_rules"]):
        return False
    if lc.room_type == "not shared room":
        return row["room type"] != "Shared room"
    return not lc.room_type or row["room type"] == ROOM_TYPE_TEXT.get(lc.room_type)


def _searches(
    q: Query, stops: list[str], legs: list[str], dates: list[str]
) -> list[tuple[str, dict[str, Any]]]:
    calls = []
    route = [q.org, *stops, q.org]
    for (o, d), date, text in zip(itertools.pairwise(route), dates, legs, strict=True):
        if text.startswith("Flight"):
            calls.append(("search_flights", {"origin": o, "destination": d, "date": date}))
        else:
            mode = "self-driving" if text.startswith("Self-driving") else "taxi"
            calls.append(("distance", {"origin": o, "destination": d, "mode": mode}))
    for city in stops:
        calls += [(f"search_{t}", {"city": city}) for t in ("accommodations", "restaurants", "attractions")]
    return calls


def greedy_cheap(q: Query, db: TravelDB, rng: np.random.Generator | None = None) -> Planned:
    """The cheapest constraint-respecting plan a greedy searcher finds (None if it finds none)."""
    options, head = _stop_options(q, db)
    nights = max((q.days - 1) // q.visiting_city_number, 1)
    for stops in options:
        dates = _route_dates(q, len(stops))
        legs = _cheapest_legs(db, q, [q.org, *stops, q.org], dates)
        if legs is None:
            continue
        stays = []
        for city in stops:
            allowed = [r for r in db.accommodations(city) if _stay_ok(r, q, nights)]
            if not allowed:
                break
            stays.append(
                min(
                    allowed,
                    key=lambda r: r["price"] * math.ceil(q.people_number / max(r["maximum occupancy"], 1)),
                )["NAME"]
            )
        else:
            plan = layout_plan(q.org, stops, legs, stays, q.days, *_greedy_pickers(q, db))
            if plan is not None:
                return plan, head + _searches(q, stops, legs, dates)
    return None, head


def _greedy_pickers(q: Query, db: TravelDB) -> tuple[Callable[[str], str | None], ...]:
    used_rest: set[str] = set()
    used_attr: set[str] = set()
    missing = list(q.local_constraint.cuisine or [])

    def restaurant(city: str) -> str | None:
        rows = sorted(
            (r for r in db.restaurants(city) if r["Name"] not in used_rest), key=lambda r: r["Average Cost"]
        )
        if not rows:
            return None
        serving = [r for r in rows if any(c in r["Cuisines"] for c in missing)] if city != q.org else []
        row = serving[0] if serving else rows[0]
        missing[:] = [c for c in missing if c not in row["Cuisines"] or city == q.org]
        used_rest.add(row["Name"])
        return f"{row['Name']}, {city}"

    def attraction(city: str) -> str | None:
        rows = [r["Name"] for r in db.attractions(city) if r["Name"] not in used_attr]
        if not rows:
            return None
        used_attr.add(rows[0])
        return f"{rows[0]}, {city};"

    return restaurant, attraction, attraction


def random_plan(q: Query, db: TravelDB, rng: np.random.Generator) -> Planned:
    """A plan of random picks from the search results, ignoring constraints."""
    options, head = _stop_options(q, db)
    stops = options[int(rng.integers(len(options)))] if options else [q.dest]
    dates = _route_dates(q, len(stops))
    legs = []
    for (o, d), date in zip(itertools.pairwise([q.org, *stops, q.org]), dates, strict=True):
        choices = [
            flight_text(f["Flight Number"], o, d, f["DepTime"], f["ArrTime"]) for f in db.flights(o, d, date)
        ]
        for mode in ("Self-driving", "Taxi"):
            leg = _road_leg(db, o, d, mode, q.people_number)
            choices += [leg[1]] if leg else []
        if not choices:
            return None, head
        legs.append(choices[int(rng.integers(len(choices)))])
    stays = []
    for city in stops:
        rows = db.accommodations(city)
        if not rows:
            return None, head
        stays.append(rows[int(rng.integers(len(rows)))]["NAME"])

    def pick(rows: list[dict[str, Any]], city: str, suffix: str = "") -> str | None:
        return f"{rows[int(rng.integers(len(rows)))]['Name']}, {city}{suffix}" if rows else None

    plan = layout_plan(
        q.org,
        stops,
        legs,
        stays,
        q.days,
        lambda c: pick(db.restaurants(c), c),
        lambda c: pick(db.attractions(c), c, ";"),
        lambda c: pick(db.attractions(c), c, ";"),
    )
    return plan, head + _searches(q, stops, legs, dates)


PLANNERS: dict[str, Callable[..., Planned]] = {"greedy": greedy_cheap, "random": random_plan}


def planner_actions(name: str, q: Query, db: TravelDB, rng: np.random.Generator) -> list[str]:
    """The tool-call actions of planner ``name``: its searches, then ``submit_plan`` (if it has a plan)."""
    plan, searches = PLANNERS[name](q, db, rng)
    calls = [(n, a) for n, a in searches]
    if plan is not None:
        calls.append(("submit_plan", {"plan": [d.unit() for d in plan]}))
    hermes = get_parser("hermes")
    return [hermes.format_call(ToolCall(name=n, arguments=a)) for n, a in calls]
