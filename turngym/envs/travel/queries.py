"""Query generation: sample a feasible itinerary first, then derive the request from it.

``sample_task(db, rng, level=..., days=...)`` picks an origin, destination city (3 days) or
2–3 cities of one state (5/7 days), dates inside the database, a non-conflicting way to
travel (flights with taxis where no flight flies, or self-driving throughout), stays that
respect minimum nights, distinct restaurants and attractions. The hard constraints are then
chosen among those the itinerary satisfies (house rule, cuisine, room type, transportation)
and the budget is set above its cost, so every query is solvable by construction — the
sampled plan, returned with the query, passes every check (``sample_task`` verifies it).

Levels follow TravelPlanner: *easy* = one person, budget only; *medium* = 2–8 people, budget
plus one of house rule / cuisine / room type; *hard* = 2–8 people, budget plus three of house
rule / cuisine / room type / transportation. ``open_request`` writes the same trip as an
open-ended request (preferences, no checkable answer) for ``travel-open``.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from turngym.envs.travel.database import TravelDB
from turngym.envs.travel.evaluate import evaluate_plan, plan_cost
from turngym.envs.travel.models import DayPlan, LocalConstraint, Query
from turngym.envs.travel.parsing import EMPTY, flight_text, road_text
from turngym.envs.travel.schema import HOUSE_RULE_VALUES, QUERY_CUISINES

LEVELS = ("easy", "medium", "hard")
DAY_OPTIONS = (3, 5, 7)
_CITIES_FOR_DAYS = {3: 1, 5: 2, 7: 3}


class InfeasibleError(RuntimeError):
    """No feasible itinerary was found for the requested level/days in this database."""


@dataclass
class SampledTask:
    """A query, a plan that passes every check, and the tool calls that find that plan."""

    query: Query
    plan: list[DayPlan]
    searches: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    cost: float = 0.0
    preferences: list[str] = field(default_factory=list)


def sample_task(
    db: TravelDB,
    rng: np.random.Generator,
    level: str | None = None,
    days: int | None = None,
    max_tries: int = 400,
) -> SampledTask:
    level = level or str(rng.choice(LEVELS))
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    if days is None:
        days = int(rng.choice(DAY_OPTIONS))
    if days not in DAY_OPTIONS:
        raise ValueError(f"days must be one of {DAY_OPTIONS}, got {days}")
    if len(db.dates) < days:
        raise InfeasibleError(f"the database covers {len(db.dates)} dates, fewer than {days}")
    for _ in range(max_tries):
        task = _try_sample(db, rng, level, days)
        if task is not None:
            return task
    raise InfeasibleError(f"no feasible {days}-day {level} trip found in {max_tries} tries")


def _try_sample(db: TravelDB, rng: np.random.Generator, level: str, days: int) -> SampledTask | None:
    k = _CITIES_FOR_DAYS[days]
    cities = db.cities
    org = cities[int(rng.integers(len(cities)))]
    start = int(rng.integers(0, len(db.dates) - days + 1))
    dates = _date_range(db.dates[start], days)
    # most trips start with a flight, as in TravelPlanner: aim at a city reachable by air that day
    by_air = [c for c in db.destinations(org, dates[0]) if c != org] if rng.random() < 0.75 else []
    if k == 1:
        pool = by_air or cities
        dest_city = pool[int(rng.integers(len(pool)))]
        if dest_city == org:
            return None
        stops, dest = [dest_city], dest_city
    else:
        states = [s for s, cs in db.state_cities.items() if len(cs) >= k and db.city_state[org] != s]
        air_states = sorted({db.city_state[c] for c in by_air} & set(states))
        if not states:
            return None
        pool_states = air_states or states
        dest = pool_states[int(rng.integers(len(pool_states)))]
        pool = db.state_cities[dest]
        first = [c for c in pool if c in by_air]
        stops = [pool[i] for i in rng.choice(len(pool), size=k, replace=False)]
        if first and stops[0] not in first:
            entry = first[int(rng.integers(len(first)))]
            stops = [entry, *[c for c in stops if c != entry]][:k]
    people = 1 if level == "easy" else int(rng.integers(2, 9))

    route = [org, *stops, org]
    legs = _choose_legs(db, rng, route, [dates[2 * j] for j in range(len(route) - 1)])
    if legs is None:
        return None
    nights = (days - 1) // k
    stays = []
    for city in stops:
        options = [r for r in db.accommodations(city) if r["minimum nights"] <= nights]
        if not options:
            return None
        stays.append(options[int(rng.integers(len(options)))])
    plan = _build_plan(db, rng, org, stops, legs, stays, days)
    if plan is None:
        return None

    units = [d.unit() for d in plan]
    constraint = _choose_constraints(db, rng, level, org, units, stays, legs)
    if constraint is None:
        return None
    q = Query(
        org=org,
        dest=dest,
        days=days,
        visiting_city_number=k,
        date=dates,
        people_number=people,
        local_constraint=constraint,
        budget=0,
        level=level,
    )
    cost = plan_cost(q, plan, db)
    q.budget = float(math.ceil(cost * rng.uniform(1.1, 1.6) / 100) * 100)
    q.query = request_text(q, rng)
    if not evaluate_plan(q, plan, db).final_pass:
        return None
    searches = _searches(db, org, dest, stops, legs, k)
    return SampledTask(query=q, plan=plan, searches=searches, cost=cost)


def _date_range(first: str, days: int) -> list[str]:
    d0 = dt.date.fromisoformat(first)
    return [(d0 + dt.timedelta(days=i)).isoformat() for i in range(days)]


@dataclass
class _Leg:
    origin: str
    destination: str
    date: str
    mode: str  # Flight, Self-driving, Taxi
    text: str


def _choose_legs(db: TravelDB, rng, route: list[str], dates: list[str]) -> list[_Leg] | None:
    policies = ["air", "drive"] if rng.random() < 0.7 else ["drive", "air"]
    for policy in policies:
        legs = []
        for (o, d), date in zip(zip(route, route[1:], strict=False), dates, strict=True):
            leg = _leg(db, rng, o, d, date, policy)
            if leg is None:
                break
            legs.append(leg)
        else:
            return legs
    return None


def _leg(db: TravelDB, rng, o: str, d: str, date: str, policy: str) -> _Leg | None:
    if policy == "air":
        flights = sorted(db.flights(o, d, date), key=lambda r: r["Price"])
        if flights:
            f = flights[int(rng.integers(0, max(1, (len(flights) + 1) // 2)))]
            return _Leg(
                o, d, date, "Flight", flight_text(f["Flight Number"], o, d, f["DepTime"], f["ArrTime"])
            )
        mode = "Taxi"
    else:
        mode = "Self-driving"
    road = db.road(o, d, mode)
    if road is None or road["cost"] is None:
        return None
    return _Leg(o, d, date, mode, road_text(mode, o, d, road["duration"], road["distance"], road["cost"]))


def _build_plan(
    db: TravelDB, rng, org: str, stops: list[str], legs: list[_Leg], stays, days: int
) -> list[DayPlan] | None:
    """The sampler's plan: random distinct restaurants and attractions."""
    used_rest: set[str] = set()
    used_attr: set[str] = set()

    def pick_restaurant(city: str) -> str | None:
        options = [r["Name"] for r in db.restaurants(city) if r["Name"] not in used_rest]
        if not options:
            return None
        name = options[int(rng.integers(len(options)))]
        used_rest.add(name)
        return f"{name}, {city}"

    def pick_attractions(city: str, n: int) -> str | None:
        options = [r["Name"] for r in db.attractions(city) if r["Name"] not in used_attr]
        if len(options) < n:
            return None
        chosen = [options[i] for i in rng.choice(len(options), size=n, replace=False)]
        used_attr.update(chosen)
        return "".join(f"{a}, {city};" for a in chosen)

    return layout_plan(
        org,
        stops,
        [leg.text for leg in legs],
        [s["NAME"] for s in stays],
        days,
        pick_restaurant,
        lambda city: pick_attractions(city, int(rng.integers(1, 4))),
        lambda city: pick_attractions(city, 1),
    )


def layout_plan(
    org: str,
    stops: list[str],
    legs: list[str],
    stays: list[str],
    days: int,
    restaurant: Callable[[str], str | None],
    attractions: Callable[[str], str | None],
    arrival_attraction: Callable[[str], str | None],
) -> list[DayPlan] | None:
    """Lay a trip out day by day in TravelPlanner's format (None when a picker runs dry).

    Stop j is entered on day ``2j+1`` (1-based) by ``legs[j]`` and its stay ``stays[j]`` is
    used until the next move; the last day returns to ``org`` by ``legs[-1]``. Travel days
    eat in the cities they touch; the first breakfast and the last dinner are "-".
    """
    plan = []
    nights = (days - 1) // len(stops)
    for i in range(days):
        stop_idx = min(i // nights, len(stops) - 1)
        city = stops[stop_idx]
        day: dict[str, Any] = {"days": i + 1}
        if i == days - 1:
            day.update(
                current_city=f"from {city} to {org}",
                transportation=legs[-1],
                breakfast=restaurant(city),
                attraction=EMPTY,
                lunch=restaurant(city),
                dinner=EMPTY,
                accommodation=EMPTY,
            )
        elif i % nights == 0:
            prev = org if i == 0 else stops[stop_idx - 1]
            day.update(
                current_city=f"from {prev} to {city}",
                transportation=legs[stop_idx],
                breakfast=EMPTY if i == 0 else restaurant(prev),
                attraction=arrival_attraction(city),
                lunch=restaurant(city),
                dinner=restaurant(city),
                accommodation=f"{stays[stop_idx]}, {city}",
            )
        else:
            day.update(
                current_city=city,
                transportation=EMPTY,
                breakfast=restaurant(city),
                attraction=attractions(city),
                lunch=restaurant(city),
                dinner=restaurant(city),
                accommodation=f"{stays[stop_idx]}, {city}",
            )
        if any(v is None for v in day.values()):
            return None
        plan.append(DayPlan.model_validate(day))
    return plan


def _choose_constraints(
    db: TravelDB, rng, level: str, org: str, units, stays, legs
) -> LocalConstraint | None:
    if level == "easy":
        return LocalConstraint()
    options: dict[str, list[Any]] = {}
    rules = [r for r in HOUSE_RULE_VALUES if not any(f"No {r}" in s["house_rules"] for s in stays)]
    if rules:
        options["house_rule"] = rules
    served: set[str] = set()
    for u in units:
        for meal in ("breakfast", "lunch", "dinner"):
            v = u.get(meal, EMPTY)
            if v != EMPTY:
                name, city = v.rsplit(", ", 1)
                if city != org:
                    row = db.find("restaurants", name, city)[0]
                    served.update(c for c in QUERY_CUISINES if c in row["Cuisines"])
    if served:
        options["cuisine"] = sorted(served)
    types = {s["room type"] for s in stays}
    room = []
    if "Shared room" not in types:
        room.append("not shared room")
    if types == {"Shared room"}:
        room.append("shared room")
    if types == {"Private room"}:
        room.append("private room")
    if types == {"Entire home/apt"}:
        room.append("entire room")
    if room:
        options["room_type"] = room
    modes = {leg.mode for leg in legs}
    transport = []
    if "Flight" not in modes:
        transport.append("no flight")
    if "Self-driving" not in modes:
        transport.append("no self-driving")
    pool = ["house_rule", "cuisine", "room_type"] + (["transportation"] if level == "hard" else [])
    if transport:
        options["transportation"] = transport
    pool = [p for p in pool if p in options]
    want = 1 if level == "medium" else 3
    if len(pool) < want:
        return None
    chosen = [pool[i] for i in rng.choice(len(pool), size=want, replace=False)]
    values: dict[str, Any] = {}
    for name in chosen:
        opts = options[name]
        if name == "cuisine":
            n = int(rng.integers(1, min(3, len(opts)) + 1))
            values[name] = [opts[i] for i in sorted(rng.choice(len(opts), size=n, replace=False))]
        else:
            values[name] = opts[int(rng.integers(len(opts)))]
    return LocalConstraint(**values)


def _searches(db: TravelDB, org: str, dest: str, stops: list[str], legs: list[_Leg], k: int):
    calls: list[tuple[str, dict[str, Any]]] = []
    if k > 1:
        calls.append(("search_cities", {"state": dest}))
    for leg in legs:
        if leg.mode == "Flight":
            calls.append(
                ("search_flights", {"origin": leg.origin, "destination": leg.destination, "date": leg.date})
            )
        else:
            mode = "self-driving" if leg.mode == "Self-driving" else "taxi"
            calls.append(("distance", {"origin": leg.origin, "destination": leg.destination, "mode": mode}))
    for city in stops:
        calls.append(("search_accommodations", {"city": city}))
        calls.append(("search_restaurants", {"city": city}))
        calls.append(("search_attractions", {"city": city}))
    return calls


# ------------------------------------------------------------------ wording
_OPENINGS = (
    "Please help me plan a trip from {org} to {dest} spanning {days} days from {start} to {end}.",
    "Could you create a {days}-day travel plan for {who}, departing from {org} and heading to {dest}, "
    "from {start} to {end}?",
    "I'm planning a {days}-day journey for {who} starting in {org} and visiting {dest}, from {start} to {end}.",
    "Can you put together an itinerary for {who}: {org} to {dest}, {start} through {end} ({days} days)?",
    "We're looking for a {days}-day itinerary from {org} to {dest}, leaving on {start} and coming back on {end}.",
    "Design a {days}-day round trip from {org} to {dest} for {who}, {start} to {end}.",
)
_MULTI = (" The trip should cover {k} cities in {state}.", " We want to see {k} different cities in {state}.")
_BUDGET = (
    " The budget is ${budget:,}.",
    " Our total budget is ${budget:,}.",
    " We can spend at most ${budget:,} in total.",
    " Please keep everything within ${budget:,}.",
)
_RULE = {
    "smoking": (
        "The accommodation must allow smoking.",
        "One of us smokes, so we need a place that permits smoking.",
    ),
    "parties": (
        "We need accommodations that allow parties.",
        "We'd like to host a small party, so parties must be allowed.",
    ),
    "children under 10": (
        "We are traveling with children under 10, so the place must allow them.",
        "Our kids are under 10; please pick accommodations that welcome them.",
    ),
    "visitors": (
        "Our accommodations must allow visitors.",
        "Friends will drop by, so visitors must be allowed.",
    ),
    "pets": (
        "We're bringing our dog, so accommodations must be pet-friendly.",
        "Pets must be allowed where we stay.",
    ),
}
_ROOM = {
    "not shared room": ("We don't want to share a room with strangers.", "No shared rooms, please."),
    "shared room": (
        "A shared room is fine with us and keeps costs down.",
        "We'd like to stay in shared rooms.",
    ),
    "private room": ("We'd prefer private rooms.", "Please book private rooms."),
    "entire room": ("We want an entire home or apartment to ourselves.", "Please find entire apartments."),
}
_TRANSPORT = {
    "no flight": ("We'd rather not fly.", "Please avoid flights on this trip."),
    "no self-driving": ("We won't be driving ourselves.", "Self-driving is not an option for us."),
}


def _wording(q: Query) -> dict[str, Any]:
    """The fields the opening templates of a request are formatted with."""
    who = "one person" if q.people_number == 1 else f"a group of {q.people_number}"
    return {"org": q.org, "dest": q.dest, "days": q.days, "start": q.date[0], "end": q.date[-1], "who": who}


def _cuisine_text(cuisines: list[str], rng) -> str:
    joined = cuisines[0] if len(cuisines) == 1 else ", ".join(cuisines[:-1]) + f" and {cuisines[-1]}"
    forms = (
        f"We'd like to try {joined} cuisine during the trip.",
        f"Our meals should include {joined} food.",
        f"We love {joined} food, so please include it.",
    )
    return forms[int(rng.integers(len(forms)))]


def request_text(q: Query, rng: np.random.Generator) -> str:
    """The natural-language query of a TravelPlanner-style request (varied templates)."""
    fmt = _wording(q)
    text = _OPENINGS[int(rng.integers(len(_OPENINGS)))].format(**fmt)
    if q.visiting_city_number > 1:
        text += _MULTI[int(rng.integers(len(_MULTI)))].format(k=q.visiting_city_number, state=q.dest)
    text += _BUDGET[int(rng.integers(len(_BUDGET)))].format(budget=int(q.budget))
    lc = q.local_constraint
    extras = []
    if lc.house_rule:
        extras.append(_RULE[lc.house_rule][int(rng.integers(2))])
    if lc.cuisine:
        extras.append(_cuisine_text(lc.cuisine, rng))
    if lc.room_type:
        extras.append(_ROOM[lc.room_type][int(rng.integers(2))])
    if lc.transportation:
        extras.append(_TRANSPORT[lc.transportation][int(rng.integers(2))])
    order = rng.permutation(len(extras))
    return " ".join([text, *(extras[i] for i in order)]).strip()


_OPEN_OPENINGS = (
    "We're {who} in {org} dreaming of {days} days in {dest} ({start} to {end}). What would you suggest?",
    "Plan something memorable for {who}: {days} days from {org} to {dest}, {start} to {end}.",
    "I'd love a relaxed {days}-day getaway from {org} to {dest} for {who}, {start} to {end}.",
    "Help {who} make the most of {days} days in {dest}, leaving {org} on {start} and back on {end}.",
)
_OPEN_PREFS = {
    "house_rule": "somewhere that is fine with {v}",
    "cuisine": "good {v} food",
    "room_type": "{v} accommodation",
    "transportation": "{v}",
}


def open_request(q: Query, rng: np.random.Generator) -> tuple[str, list[str]]:
    """An open-ended wording of ``q`` (soft preferences) and the list of those preferences."""
    fmt = _wording(q)
    text = _OPEN_OPENINGS[int(rng.integers(len(_OPEN_OPENINGS)))].format(**fmt)
    if q.visiting_city_number > 1:
        text += f" Seeing a few places ({q.visiting_city_number} cities) would be great."
    prefs = []
    lc = q.local_constraint
    for name in ("house_rule", "cuisine", "room_type", "transportation"):
        v = getattr(lc, name)
        if v:
            value = " and ".join(v) if isinstance(v, list) else v
            prefs.append(_OPEN_PREFS[name].format(v=value))
    if prefs:
        text += " Ideally: " + "; ".join(prefs) + "."
    text += f" We'd like to stay around ${int(q.budget):,} if we can."
    return text, prefs
