"""TravelPlanner's evaluation: 8 commonsense checks, 5 hard checks and the aggregate metrics.

``evaluate_plan(query, plan, db)`` follows the published evaluator
(``evaluation/commonsense_constraint.py``, ``hard_constraint.py``, ``eval.py``): hard checks
run only for a delivered plan that passes *complete information* and *within sandbox*; a
hard check whose constraint the query does not set is ``None`` (not applicable).

``strict=True`` (the default) fixes the published evaluator's known loopholes, all of which
only make a check *harder* to pass:

* *within current city* compares the parsed city of ``"Name, City"`` with the day's cities
  (the original iterates over the characters of a single-city day, so it never fails there);
* *within sandbox* also requires a flight to fly on that day's date, and rejects a
  transportation entry that is none of flight / self-driving / taxi;
* *reasonable city route* requires a one-city trip to visit the query's destination;
* *cuisine* skips only the origin-city meal (the original skips the rest of that day).

``strict=False`` reproduces the published semantics for comparison with published numbers.
``aggregate_metrics`` computes delivery rate, commonsense micro/macro, hard micro/macro and
final pass rate exactly as ``eval.py`` does (micro over every check of every query,
undelivered plans counting as failures; hard micro over the constraints each query sets).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from turngym.envs.travel.database import TravelDB
from turngym.envs.travel.models import DayPlan, Query
from turngym.envs.travel.parsing import (
    NO_MORE_DAYS,
    day_cities,
    from_to,
    is_empty,
    name_city,
    parse_leg,
    split_attractions,
    transport_mode,
)
from turngym.envs.travel.schema import ACCOMMODATIONS, ATTRACTIONS, RESTAURANTS

COMMONSENSE = (
    "reasonable_city_route",
    "diverse_restaurants",
    "diverse_attractions",
    "non_conflicting_transportation",
    "within_current_city",
    "within_sandbox",
    "minimum_nights",
    "complete_information",
)
HARD = ("budget", "room_rule", "cuisine", "room_type", "transportation")
#: TravelPlanner's paper names of the checks.
PAPER_NAMES = {
    "reasonable_city_route": "Reasonable City Route",
    "diverse_restaurants": "Diverse Restaurants",
    "diverse_attractions": "Diverse Attractions",
    "non_conflicting_transportation": "Non-conf. Transportation",
    "within_current_city": "Within Current City",
    "within_sandbox": "Within Sandbox",
    "minimum_nights": "Minimum Nights Stay",
    "complete_information": "Complete Information",
    "budget": "Budget",
    "room_rule": "Room Rule",
    "cuisine": "Cuisine",
    "room_type": "Room Type",
    "transportation": "Transportation",
}
MEALS = ("breakfast", "lunch", "dinner")
HOUSE_RULE_TEXT = {
    "smoking": "No smoking",
    "parties": "No parties",
    "children under 10": "No children under 10",
    "visitors": "No visitors",
    "pets": "No pets",
}
ROOM_TYPE_TEXT = {
    "shared room": "Shared room",
    "private room": "Private room",
    "entire room": "Entire home/apt",
}

Check = tuple[bool | None, str | None]


@dataclass
class PlanEvaluation:
    """Per-check results ``(passed, reason)`` of one plan; ``hard`` is None when not evaluated."""

    delivered: bool
    commonsense: dict[str, Check] = field(default_factory=dict)
    hard: dict[str, Check] | None = None
    total_cost: float | None = None

    @property
    def commonsense_pass(self) -> bool:
        return self.delivered and all(ok is not False for ok, _ in self.commonsense.values())

    @property
    def hard_pass(self) -> bool:
        return self.hard is not None and all(ok is not False for ok, _ in self.hard.values())

    @property
    def final_pass(self) -> bool:
        return self.commonsense_pass and self.hard_pass

    def failures(self) -> list[str]:
        """``"check: reason"`` for every failed check."""
        out = [f"{k}: {why}" for k, (ok, why) in self.commonsense.items() if ok is False]
        out += [f"{k}: {why}" for k, (ok, why) in (self.hard or {}).items() if ok is False]
        return out

    def components(self) -> dict[str, float]:
        """``pass``, ``cs.<check>`` and (when evaluated and applicable) ``hard.<check>`` as floats."""
        out = {"pass": float(self.final_pass)}
        for name in COMMONSENSE:
            ok = self.commonsense.get(name, (False, None))[0]
            out[f"cs.{name}"] = float(bool(ok))
        for name, (ok, _) in (self.hard or {}).items():
            if ok is not None:
                out[f"hard.{name}"] = float(ok)
        return out


def evaluate_plan(
    query: Query | dict[str, Any],
    plan: Sequence[DayPlan | dict[str, Any]] | None,
    db: TravelDB,
    strict: bool = True,
) -> PlanEvaluation:
    """Run every check of TravelPlanner on ``plan`` (``None`` or empty = not delivered)."""
    q = query if isinstance(query, Query) else Query.model_validate(query)
    if not plan:
        return PlanEvaluation(delivered=False)
    units = [d.unit() if isinstance(d, DayPlan) else dict(d) for d in plan]
    units = [{k: v for k, v in u.items() if v is not None} for u in units][: q.days]
    ctx = _Ctx(q, units, db, strict)
    checks = {
        "reasonable_city_route": ctx.reasonable_city_route,
        "diverse_restaurants": ctx.diverse_restaurants,
        "diverse_attractions": ctx.diverse_attractions,
        "non_conflicting_transportation": ctx.non_conflicting_transportation,
        "within_current_city": ctx.within_current_city,
        "within_sandbox": ctx.within_sandbox,
        "minimum_nights": ctx.minimum_nights,
        "complete_information": ctx.complete_information,
    }
    ev = PlanEvaluation(delivered=True, commonsense={k: fn() for k, fn in checks.items()})
    if ev.commonsense["complete_information"][0] and ev.commonsense["within_sandbox"][0]:
        ev.total_cost = ctx.total_cost()
        ev.hard = {
            "budget": (
                ev.total_cost <= q.budget,
                None
                if ev.total_cost <= q.budget
                else f"the plan costs {ev.total_cost:g}, over the budget of {q.budget:g}",
            ),
            "room_rule": ctx.room_rule(),
            "cuisine": ctx.cuisine(),
            "room_type": ctx.room_type(),
            "transportation": ctx.transportation(),
        }
    return ev


def _get(unit: dict[str, Any], key: str) -> str:
    v = unit.get(key)
    return "" if is_empty(v) else str(v).strip()


class _Ctx:
    def __init__(self, q: Query, units: list[dict[str, Any]], db: TravelDB, strict: bool):
        self.q, self.units, self.db, self.strict = q, units, db, strict

    # -------------------------------------------------------- commonsense
    def city_list(self) -> tuple[list[str], str | None]:
        cities: list[str] = []
        for i, unit in enumerate(self.units):
            cur = _get(unit, "current_city")
            pair = from_to(cur)
            if pair:
                if i == 0 and pair[0] != self.q.org:
                    return cities, f"the first day's city should be {self.q.org}"
                cities += list(pair)
            else:
                cities += day_cities(cur)
        return cities, None

    def reasonable_city_route(self) -> Check:
        cities, err = self.city_list()
        if err:
            return False, err
        if not cities:
            return False, "the plan names no cities"
        if cities[0] != cities[-1]:
            return False, "the trip should be a closed circle"
        if not _valid_city_sequence(cities):
            return False, "the city sequence is invalid"
        dest_is_state = self.q.dest in self.db.state_cities
        for idx, city in enumerate(cities):
            if city not in self.db.city_state:
                return False, f"{city} is not a valid city"
            if idx in (0, len(cities) - 1):
                continue
            if self.q.days > 3 and dest_is_state and self.db.city_state[city] != self.q.dest:
                return False, f"{city} is not in {self.q.dest}"
            if self.strict and self.q.visiting_city_number == 1 and not dest_is_state and city != self.q.dest:
                return False, f"the trip should visit {self.q.dest}, not {city}"
        return True, None

    def diverse_restaurants(self) -> Check:
        seen: set[str] = set()
        for i, unit in enumerate(self.units):
            for meal in MEALS:
                v = _get(unit, meal)
                if v:
                    if v in seen:
                        return False, f"the restaurant of day {i + 1} {meal} ({v}) is repeated"
                    seen.add(v)
        return True, None

    def diverse_attractions(self) -> Check:
        seen: set[str] = set()
        for i, unit in enumerate(self.units):
            for a in split_attractions(_get(unit, "attraction")):
                if a in seen:
                    return False, f"the attraction {a!r} of day {i + 1} is repeated"
                seen.add(a)
        return True, None

    def non_conflicting_transportation(self) -> Check:
        if not self.units or not _get(self.units[0], "transportation"):
            return False, "the transportation of day 1 should not be empty"
        modes = {transport_mode(_get(u, "transportation")) for u in self.units if _get(u, "transportation")}
        if "Self-driving" in modes and ("Flight" in modes or "Taxi" in modes):
            return False, "the transportation is conflicting (self-driving with a flight or a taxi)"
        return True, None

    def within_current_city(self) -> Check:
        for i, unit in enumerate(self.units):
            cities = day_cities(_get(unit, "current_city"))
            trans = _get(unit, "transportation")
            if trans and any(c not in trans for c in cities):
                return False, f"the transportation of day {i + 1} does not match the day's cities"
            items = [(m, _get(unit, m)) for m in MEALS] + [
                ("attraction", a) for a in split_attractions(_get(unit, "attraction"))
            ]
            for what, v in items:
                if v and not self._in_cities(v, cities):
                    return False, f"the {what} of day {i + 1} ({v}) is not in {' or '.join(cities)}"
            acc = _get(unit, "accommodation")
            if acc and not self._in_cities(acc, cities[-1:]):
                return False, f"the accommodation of day {i + 1} is not in {cities[-1]}"
        return True, None

    def _in_cities(self, item: str, cities: list[str]) -> bool:
        if not self.strict:
            return any(c in item for c in cities)
        nc = name_city(item)
        return nc is not None and nc[1] in cities

    def within_sandbox(self) -> Check:
        for i, unit in enumerate(self.units):
            trans = _get(unit, "transportation")
            if trans:
                ok, why = self._leg_in_sandbox(i, trans, _get(unit, "current_city"))
                if not ok:
                    return False, why
            for meal in MEALS:
                v = _get(unit, meal)
                if v and not self._found(RESTAURANTS, v):
                    return False, f"the {meal} of day {i + 1} ({v}) is not in the sandbox"
            for a in split_attractions(_get(unit, "attraction")):
                if not self._found(ATTRACTIONS, a):
                    return False, f"the attraction {a!r} of day {i + 1} is not in the sandbox"
            acc = _get(unit, "accommodation")
            if acc and not self._found(ACCOMMODATIONS, acc):
                return False, f"the accommodation of day {i + 1} ({acc}) is not in the sandbox"
        return True, None

    def _leg_in_sandbox(self, i: int, trans: str, current_city: str) -> Check:
        leg = parse_leg(trans, current_city)
        if "flight number" in trans.lower():
            row = self.db.flight_by_number(leg.flight_number) if leg.flight_number else None
            if (
                row is None
                or row["OriginCityName"] != leg.origin
                or row["DestCityName"] != leg.destination
                or (self.strict and i < len(self.q.date) and row["FlightDate"] != self.q.date[i])
            ):
                return False, f"the flight of day {i + 1} is not in the sandbox"
            return True, None
        if leg.mode in ("Self-driving", "Taxi"):
            road = self.db.road(leg.origin or "-", leg.destination or "-", leg.mode)
            if road is None or road["cost"] is None:
                return False, f"the {leg.mode.lower()} of day {i + 1} is not in the sandbox"
            return True, None
        if self.strict:
            return False, f"the transportation of day {i + 1} is not a flight, self-driving or taxi"
        return True, None

    def _found(self, table: str, item: str) -> dict[str, Any] | None:
        nc = name_city(item)
        if nc is None:
            return None
        rows = self.db.find(table, *nc)
        return rows[0] if rows else None

    def minimum_nights(self) -> Check:
        accs = [_get(u, "accommodation") for u in self.units]
        for value, run in _runs(accs):
            if not value:
                continue
            nc = name_city(value)
            rows = self.db.find(ACCOMMODATIONS, *nc) if nc else []
            if len(rows) == 1 and run < rows[0]["minimum nights"]:
                return (
                    False,
                    f"{value} needs at least {rows[0]['minimum nights']:g} nights; the plan stays {run}",
                )
        return True, None

    def complete_information(self) -> Check:
        q = self.q
        days = sum(1 for u in self.units if u and u.get("current_city") != NO_MORE_DAYS)
        if days != q.days:
            return False, f"the plan should have {q.days} days, it has {days}"
        cities, err = self.city_list()
        if err:
            return False, err
        visited = set(cities) - {q.org}
        if len(visited) != q.visiting_city_number:
            return False, f"the trip should visit {q.visiting_city_number} cities, it visits {len(visited)}"
        valid = 0
        for i, unit in enumerate(self.units):
            missing = [k for k in ("transportation", *MEALS, "attraction", "accommodation") if k not in unit]
            if missing:
                return False, f"day {i + 1} has no {missing[0]} field"
            cur = _get(unit, "current_city")
            travel = "from " in cur
            if (travel or "to " in cur) and not _get(unit, "transportation"):
                return False, f"day {i + 1} moves between cities without transportation"
            if not travel and " to " not in cur and not _get(unit, "attraction"):
                return False, f"day {i + 1} has no attraction"
            if i != q.days - 1 and not _get(unit, "accommodation"):
                return False, f"day {i + 1} has no accommodation"
            if not travel and not all(_get(unit, m) for m in MEALS):
                return False, f"day {i + 1} misses a meal"
            valid += sum(1 for v in unit.values() if v and v != "-")
        if valid / (6 * q.days) < 0.5:
            return False, "more than half of the information is absent"
        return True, None

    # --------------------------------------------------------------- hard
    def total_cost(self) -> float:
        db, people = self.db, self.q.people_number
        total = 0.0
        for unit in self.units:
            trans = _get(unit, "transportation")
            if trans:
                leg = parse_leg(trans, _get(unit, "current_city"))
                if leg.origin is not None and leg.destination is not None:
                    if "flight number" in trans.lower():
                        row = db.flight_by_number(leg.flight_number or "")
                        if row is not None:
                            total += float(row["Price"]) * people
                    elif leg.mode in ("Self-driving", "Taxi"):
                        road = db.road(leg.origin, leg.destination, leg.mode)
                        if road is not None and road["cost"] is not None:
                            per = 5 if leg.mode == "Self-driving" else 4
                            total += road["cost"] * math.ceil(people / per)
            for meal in MEALS:
                v = _get(unit, meal)
                row = self._found(RESTAURANTS, v) if v else None
                if row is not None:
                    total += float(row["Average Cost"]) * people
            acc = _get(unit, "accommodation")
            row = self._found(ACCOMMODATIONS, acc) if acc else None
            if row is not None:
                total += float(row["price"]) * math.ceil(people / max(int(row["maximum occupancy"]), 1))
        return total

    def _accommodation_rows(self) -> list[dict[str, Any]]:
        rows = []
        for unit in self.units:
            acc = _get(unit, "accommodation")
            row = self._found(ACCOMMODATIONS, acc) if acc else None
            if row is not None:
                rows.append(row)
        return rows

    def room_rule(self) -> Check:
        rule = self.q.local_constraint.house_rule
        if rule is None:
            return None, None
        forbidden = HOUSE_RULE_TEXT.get(rule)
        for row in self._accommodation_rows():
            if forbidden and forbidden in str(row["house_rules"]):
                return False, f"{row['NAME']} does not allow {rule}"
        return True, None

    def room_type(self) -> Check:
        want = self.q.local_constraint.room_type
        if want is None:
            return None, None
        for row in self._accommodation_rows():
            got = row["room type"]
            bad = got == "Shared room" if want == "not shared room" else got != ROOM_TYPE_TEXT.get(want, got)
            if bad:
                return False, f"{row['NAME']} is a {got.lower()}, the query asks for a {want}"
        return True, None

    def cuisine(self) -> Check:
        wanted = self.q.local_constraint.cuisine
        if not wanted:
            return None, None
        found: set[str] = set()
        for unit in self.units:
            for meal in MEALS:
                v = _get(unit, meal)
                nc = name_city(v) if v else None
                if nc is None:
                    continue
                if nc[1] == self.q.org:
                    if self.strict:
                        continue
                    break  # the published evaluator skips the rest of the day
                rows = self.db.find(RESTAURANTS, *nc)
                if rows:
                    found.update(c for c in wanted if c in str(rows[0]["Cuisines"]))
        missing = [c for c in wanted if c not in found]
        return (False, f"no meal serves {missing[0]} cuisine") if missing else (True, None)

    def transportation(self) -> Check:
        rule = self.q.local_constraint.transportation
        if rule is None:
            return None, None
        for unit in self.units:
            trans = _get(unit, "transportation")
            if rule == "no flight" and "Flight" in trans:
                return False, "the query rules out flights"
            if rule == "no self-driving" and "Self-driving" in trans:
                return False, "the query rules out self-driving"
        return True, None


def plan_cost(query: Query, plan: Sequence[DayPlan | dict[str, Any]], db: TravelDB) -> float:
    """TravelPlanner's total cost of a plan for the query's party (what the budget check compares)."""
    units = [d.unit() if isinstance(d, DayPlan) else dict(d) for d in plan]
    return _Ctx(query, units[: query.days], db, strict=True).total_cost()


def _valid_city_sequence(cities: list[str]) -> bool:
    """TravelPlanner's ``is_valid_city_sequence``: each inner city visited once, consecutively."""
    if len(cities) < 3:
        return False
    visited: set[str] = set()
    i = 0
    while i < len(cities):
        city = cities[i]
        if city in visited and i not in (0, len(cities) - 1):
            return False
        count = 0
        while i < len(cities) and cities[i] == city:
            count += 1
            i += 1
        if count == 1 and 0 < i - 1 < len(cities) - 1:
            return False
        visited.add(city)
    return True


def _runs(values: list[str]) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for v in values:
        if out and out[-1][0] == v:
            out[-1] = (v, out[-1][1] + 1)
        else:
            out.append((v, 1))
    return out


def aggregate_metrics(results: Iterable[tuple[Query, PlanEvaluation]]) -> dict[str, Any]:
    """TravelPlanner's summary metrics over many (query, evaluation) pairs, plus per-level pass rates."""
    n = 0
    delivered = cs_pass = cs_macro = hard_pass = hard_total = hard_macro = final = 0
    per_level: dict[str, list[int]] = {}
    per_check = {name: 0 for name in (*COMMONSENSE, *HARD)}
    for q, ev in results:
        n += 1
        delivered += ev.delivered
        for name in COMMONSENSE:
            ok = ev.commonsense.get(name, (False, None))[0]
            cs_pass += bool(ok)
            per_check[name] += bool(ok)
        hard_total += 1 + len(q.local_constraint.active())
        if ev.hard is not None:
            for name, (ok, _) in ev.hard.items():
                hard_pass += ok is True
                per_check[name] += ok is True
        cs_macro += ev.commonsense_pass and ev.hard is not None
        hard_macro += ev.hard_pass
        final += ev.final_pass
        lvl = per_level.setdefault(q.level, [0, 0])
        lvl[0] += ev.final_pass
        lvl[1] += 1
    if n == 0:
        raise ValueError("aggregate_metrics needs at least one evaluated plan")
    return {
        "n": n,
        "delivery_rate": delivered / n,
        "commonsense_micro": cs_pass / (len(COMMONSENSE) * n),
        "commonsense_macro": cs_macro / n,
        "hard_micro": hard_pass / hard_total,
        "hard_macro": hard_macro / n,
        "final_pass_rate": final / n,
        "final_pass_by_level": {k: v[0] / v[1] for k, v in sorted(per_level.items())},
        "check_pass_counts": per_check,
    }
