"""Turn-level verifier (DeepTravel-style): every plan item must come from a tool result.

A :class:`Ledger` records what the search tools returned during the episode (flight numbers,
road legs, and ``(name, city)`` of accommodations, restaurants and attractions) together
with the turn that first returned it. ``ledger.check(plan)`` says, item by item, whether the
plan only uses what the agent actually looked up, and which turn supplied each item — the
per-turn support a ``turn``/``gated`` credit method can pay.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from turngym.envs.travel.models import DayPlan
from turngym.envs.travel.parsing import is_empty, name_city, parse_leg, split_attractions
from turngym.envs.travel.schema import ACCOMMODATIONS, ATTRACTIONS, RESTAURANTS


@dataclass
class ItemCheck:
    day: int
    field: str
    value: str
    turn: int | None  # the turn whose tool result held this item; None = never returned

    @property
    def grounded(self) -> bool:
        return self.turn is not None


@dataclass
class GroundingReport:
    items: list[ItemCheck] = field(default_factory=list)

    @property
    def rate(self) -> float:
        """Fraction of plan items found in this episode's tool results (0 for an empty plan)."""
        return sum(i.grounded for i in self.items) / len(self.items) if self.items else 0.0

    def support_by_turn(self) -> dict[int, int]:
        """turn index -> number of plan items that turn supplied."""
        out: dict[int, int] = {}
        for i in self.items:
            if i.turn is not None:
                out[i.turn] = out.get(i.turn, 0) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "items": [{"day": i.day, "field": i.field, "value": i.value, "turn": i.turn} for i in self.items],
            "support_by_turn": [{"turn": t, "items": n} for t, n in sorted(self.support_by_turn().items())],
        }


class Ledger:
    """What the tools returned in this episode, keyed for plan matching."""

    def __init__(self) -> None:
        self.flights: dict[str, tuple[str, str, int]] = {}
        self.roads: dict[tuple[str, str, str], int] = {}
        self.places: dict[tuple[str, str, str], int] = {}

    def add_flights(self, rows: list[dict[str, Any]], turn: int) -> None:
        for r in rows:
            self.flights.setdefault(str(r["Flight Number"]), (r["OriginCityName"], r["DestCityName"], turn))

    def add_road(self, origin: str, destination: str, mode: str, turn: int) -> None:
        self.roads.setdefault((origin, destination, mode.lower()), turn)

    def add_places(self, table: str, rows: list[dict[str, Any]], turn: int) -> None:
        key = "NAME" if table == ACCOMMODATIONS else "Name"
        city_key = "city" if table == ACCOMMODATIONS else "City"
        for r in rows:
            self.places.setdefault((table, r[key], r[city_key]), turn)

    def __len__(self) -> int:
        return len(self.flights) + len(self.roads) + len(self.places)

    def _place_turn(self, table: str, value: str) -> int | None:
        nc = name_city(value)
        return None if nc is None else self.places.get((table, *nc))

    def _leg_turn(self, value: str, current_city: str) -> int | None:
        leg = parse_leg(value, current_city)
        if leg.flight_number is not None:
            hit = self.flights.get(leg.flight_number)
            return hit[2] if hit and (hit[0], hit[1]) == (leg.origin, leg.destination) else None
        if leg.mode in ("Self-driving", "Taxi") and leg.origin and leg.destination:
            return self.roads.get((leg.origin, leg.destination, leg.mode.lower()))
        return None

    def check(self, plan: list[DayPlan]) -> GroundingReport:
        report = GroundingReport()
        for day in plan:
            cur = day.current_city or ""
            if not is_empty(day.transportation):
                report.items.append(
                    ItemCheck(
                        day.days,
                        "transportation",
                        day.transportation,
                        self._leg_turn(day.transportation, cur),
                    )
                )
            for meal in ("breakfast", "lunch", "dinner"):
                v = getattr(day, meal)
                if not is_empty(v):
                    report.items.append(ItemCheck(day.days, meal, v, self._place_turn(RESTAURANTS, v)))
            for a in split_attractions("" if is_empty(day.attraction) else day.attraction or ""):
                report.items.append(ItemCheck(day.days, "attraction", a, self._place_turn(ATTRACTIONS, a)))
            if not is_empty(day.accommodation):
                v = day.accommodation or ""
                report.items.append(
                    ItemCheck(day.days, "accommodation", v, self._place_turn(ACCOMMODATIONS, v))
                )
        return report
