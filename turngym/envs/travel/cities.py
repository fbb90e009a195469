"""The geography of the generated world: real US states and cities (TravelPlanner uses US cities).

Each state carries an approximate centroid (latitude, longitude) and a spread in degrees;
city coordinates are drawn around it from the database seed, which keeps distances, flight
times and driving costs realistic without shipping a gazetteer. The table is a data file
(``data/states.json``). City names are unique across states (the TravelPlanner evaluator maps a
city to exactly one state).
"""

from __future__ import annotations

import json
from pathlib import Path

#: where the table lives: one row a state, ``"state": [latitude, longitude, spread, [cities]]``
STATES_FILE = Path(__file__).with_name("data") / "states.json"

#: state -> (latitude, longitude, spread in degrees, cities), in the file's order
STATES: dict[str, tuple[float, float, float, tuple[str, ...]]] = {
    state: (float(lat), float(lon), float(spread), tuple(cities))
    for state, (lat, lon, spread, cities) in json.loads(STATES_FILE.read_text(encoding="utf-8")).items()
}


def all_cities() -> list[tuple[str, str]]:
    """Every ``(city, state)`` pair, in a fixed order."""
    return [(city, state) for state, (*_, cities) in STATES.items() for city in cities]
