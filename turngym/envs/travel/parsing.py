"""Reading TravelPlanner's plan strings: ``"Name, City"``, ``"from A to B"``, flight and road legs.

These follow the published evaluator's conventions (``get_valid_name_city``,
``extract_from_to``, ``extract_before_parenthesis``) so that plans written for TravelPlanner
read the same here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

EMPTY = "-"
#: ``current_city`` value TravelPlanner's annotators use for days after the end of a trip.
NO_MORE_DAYS = "You don't need to fill in the information for this or later days."

_FROM_TO = re.compile(r"from\s+(.+?)\s+to\s+([^,]+)(?=[,\s]|$)")
_BEFORE_PAREN = re.compile(r"^(.*?)\([^)]*\)")
_NAME_CITY = re.compile(r"(.*?),\s*([^,]+)(\(\w[\w\s]*\))?$")
_FLIGHT_NUMBER = re.compile(r"Flight Number:\s*([^,\s]+)", re.IGNORECASE)


def is_empty(value: str | None) -> bool:
    """True for a field that holds nothing (absent, empty or ``-``)."""
    return value is None or not str(value).strip() or str(value).strip() == EMPTY


def before_parenthesis(text: str) -> str:
    """``"Chicago(Illinois)"`` -> ``"Chicago"``."""
    m = _BEFORE_PAREN.search(text)
    return (m.group(1) if m else text).strip()


def from_to(text: str) -> tuple[str, str] | None:
    """``"from A to B, ..."`` -> ``("A", "B")`` (cities without parentheses); None if absent."""
    m = _FROM_TO.search(text or "")
    if not m:
        return None
    return before_parenthesis(m.group(1)), before_parenthesis(m.group(2))


def name_city(text: str) -> tuple[str, str] | None:
    """``"Rosa's Pizza, Chicago"`` -> ``("Rosa's Pizza", "Chicago")``; None if not in that form."""
    m = _NAME_CITY.search((text or "").strip())
    if not m:
        return None
    name, city = m.group(1).strip(), before_parenthesis(m.group(2).strip())
    if not name or not city:
        return None
    return name, city


def day_cities(current_city: str) -> list[str]:
    """The cities of one day: ``[A, B]`` for ``"from A to B"``, else ``[city]``."""
    pair = from_to(current_city)
    if pair is not None:
        return list(pair)
    return [before_parenthesis(current_city)]


def is_travel_day(current_city: str) -> bool:
    return from_to(current_city) is not None


def split_attractions(text: str) -> list[str]:
    """``"A, City;B, City;"`` -> ``["A, City", "B, City"]``.

    TravelPlanner writes a ``;`` after every attraction (its evaluator drops what follows the
    last ``;``); a missing final ``;`` is accepted here.
    """
    return [part.strip() for part in (text or "").split(";") if part.strip()]


@dataclass(frozen=True)
class Leg:
    """One transportation entry: ``mode`` is ``Flight``, ``Self-driving`` or ``Taxi``."""

    mode: str | None
    origin: str | None
    destination: str | None
    flight_number: str | None = None


def transport_mode(text: str) -> str | None:
    """TravelPlanner's ``transportation_match``: taxi, then self-driving, then flight."""
    low = (text or "").lower()
    if "taxi" in low:
        return "Taxi"
    if "self-driving" in low:
        return "Self-driving"
    if "flight" in low:
        return "Flight"
    return None


def parse_leg(transportation: str, current_city: str = "") -> Leg:
    """Read a transportation entry; origin/destination fall back to the day's ``from A to B``."""
    pair = from_to(transportation) or from_to(current_city)
    origin, destination = pair if pair else (None, None)
    m = _FLIGHT_NUMBER.search(transportation or "")
    return Leg(transport_mode(transportation), origin, destination, m.group(1) if m else None)


def flight_text(number: str, origin: str, destination: str, dep: str, arr: str) -> str:
    """A flight entry in TravelPlanner's format."""
    return (
        f"Flight Number: {number}, from {origin} to {destination}, Departure Time: {dep}, Arrival Time: {arr}"
    )


def road_text(mode: str, origin: str, destination: str, duration: str, distance: str, cost: int) -> str:
    """A self-driving or taxi entry in TravelPlanner's format."""
    return f"{mode}, from {origin} to {destination}, Duration: {duration}, Distance: {distance}, Cost: {cost}"
