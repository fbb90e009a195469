"""Deterministic generator of a TravelPlanner-schema sandbox database.

``generate_tables(seed)`` returns the six tables (see :mod:`.schema`) as pandas DataFrames.
Distributions follow the published database: hub-and-spoke flight routes with a few flights
a day, prices growing with distance; Airbnb-style listings (room types, house rules, minimum
nights, occupancy, review rates); restaurants with cuisine tags, average costs and ratings;
attractions with addresses and coordinates; a road distance matrix with Google-style
durations and distances (legs of a day or more have no cost, as in TravelPlanner).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from turngym.envs.travel import schema
from turngym.envs.travel.cities import STATES
from turngym.envs.travel.schema import HOUSE_RULES, ROAD_MODES, ROOM_TYPES, road_cost

# ---------------------------------------------------------------- vocabularies
_ACC_ADJ = (
    "Cozy",
    "Sunny",
    "Spacious",
    "Charming",
    "Modern",
    "Bright",
    "Quiet",
    "Stylish",
    "Rustic",
    "Elegant",
    "Lovely",
    "Renovated",
    "Private",
    "Peaceful",
    "Luxury",
    "Budget",
    "Artsy",
    "Classic",
    "Airy",
    "Warm",
)
_ACC_KIND = {
    "Entire home/apt": (
        "apartment",
        "loft",
        "townhouse",
        "studio",
        "cottage",
        "bungalow",
        "2BR flat",
        "condo",
    ),
    "Private room": ("room", "bedroom", "guest room", "suite", "queen room", "attic room"),
    "Shared room": ("shared room", "bunk bed", "hostel bed", "couch", "dorm bed"),
}
_ACC_WHERE = (
    "near downtown",
    "by the park",
    "close to the river",
    "in the old town",
    "near the university",
    "with garden",
    "with city views",
    "near the station",
    "in a quiet street",
    "by the lake",
    "near the museum district",
    "with free parking",
    "by the beach",
    "in the arts quarter",
    "near the stadium",
    "on the hill",
    "with balcony",
    "near the market",
    "in a historic house",
)
_REST_FIRST = (
    "Golden",
    "Blue",
    "Red",
    "Little",
    "Old",
    "Happy",
    "Lucky",
    "Royal",
    "Silver",
    "Green",
    "Urban",
    "Rustic",
    "Smoky",
    "Sunny",
    "Wild",
    "Cozy",
    "Grand",
    "Hidden",
    "Crimson",
    "Iron",
    "Salty",
    "Sweet",
    "Mama's",
    "Papa's",
    "Uncle Joe's",
    "Rosa's",
    "Tony's",
    "Lin's",
    "Maya's",
    "Sam's",
    "Nina's",
    "Raj's",
)
_REST_SECOND = (
    "Spoon",
    "Table",
    "Kitchen",
    "Grill",
    "Bistro",
    "Diner",
    "Oven",
    "Garden",
    "Lantern",
    "Bowl",
    "Fork",
    "Plate",
    "Tavern",
    "Cantina",
    "Trattoria",
    "House",
    "Corner",
    "Cafe",
    "Bakery",
    "Noodle Bar",
    "Taqueria",
    "Brasserie",
    "Curry House",
    "Dumpling Room",
    "Smokehouse",
    "Deli",
    "Eatery",
    "Pantry",
)
_CUISINE_TAGS = (
    ("American", 0.30),
    ("Italian", 0.18),
    ("Chinese", 0.15),
    ("Mexican", 0.14),
    ("Indian", 0.10),
    ("Mediterranean", 0.09),
    ("French", 0.07),
    ("Fast Food", 0.22),
    ("Cafe", 0.20),
    ("Desserts", 0.18),
    ("Bakery", 0.15),
    ("Pizza", 0.16),
    ("Seafood", 0.12),
    ("BBQ", 0.10),
    ("Tea", 0.12),
    ("Japanese", 0.08),
    ("Thai", 0.07),
    ("Beverages", 0.10),
    ("Steak", 0.06),
    ("Vegan", 0.05),
)
_ATTR_FIRST = (
    "Riverside",
    "Old Mill",
    "Lakeview",
    "Pioneer",
    "Heritage",
    "Liberty",
    "Founders",
    "Cedar",
    "Maple",
    "Granite",
    "Eagle",
    "Harbor",
    "Sunset",
    "Highland",
    "Union",
    "Prairie",
    "Canyon",
    "Willow",
    "Oak Hill",
    "Veterans",
    "Grand",
    "Bayfront",
    "Meadow",
    "Rock Creek",
    "Echo",
    "Twin Pines",
    "Silver Lake",
    "Bluff",
)
_ATTR_SECOND = (
    "Art Museum",
    "History Museum",
    "Botanical Garden",
    "State Park",
    "Zoo",
    "Aquarium",
    "Science Center",
    "Historic District",
    "Memorial",
    "Observatory",
    "Nature Preserve",
    "Sculpture Garden",
    "Farmers Market",
    "Lighthouse",
    "Children's Museum",
    "Railroad Museum",
    "Waterfall Trail",
    "Amphitheater",
    "Arboretum",
    "Covered Bridge",
    "Opera House",
    "Heritage Village",
    "Wildlife Refuge",
    "Beach",
    "Pier",
    "Castle",
)
_STREETS = (
    "Main",
    "Oak",
    "Pine",
    "Elm",
    "Maple",
    "Cedar",
    "Washington",
    "Lake",
    "Hill",
    "Park",
    "River",
    "Market",
)
_STREET_KIND = ("St", "Ave", "Blvd", "Rd", "Dr", "Way")


def _hhmm_table() -> np.ndarray:
    return np.array([f"{m // 60:02d}:{m % 60:02d}" for m in range(1440)], dtype=object)


def _elapsed_table(limit: int) -> np.ndarray:
    return np.array([f"{m // 60} hours {m % 60} minutes" for m in range(limit)], dtype=object)


def _road_duration(minutes: int) -> str:
    days, rest = divmod(int(minutes), 1440)
    hours, mins = divmod(rest, 60)
    parts = []
    if days:
        parts.append(f"{days} day" + ("s" if days > 1 else ""))
    if hours:
        parts.append(f"{hours} hour" + ("s" if hours > 1 else ""))
    if mins or not parts:
        parts.append(f"{mins} min" + ("s" if mins != 1 else ""))
    return " ".join(parts)


def select_cities(n_cities: int | None) -> list[tuple[str, str]]:
    """The first ``n_cities`` cities, taking the largest of every state first (all if None)."""
    ranked = [
        (rank, s_idx, city, state)
        for s_idx, (state, (*_, cities)) in enumerate(STATES.items())
        for rank, city in enumerate(cities)
    ]
    ranked.sort()
    chosen = ranked if n_cities is None else ranked[: max(int(n_cities), 2)]
    chosen.sort(key=lambda r: (r[1], r[0]))
    return [(city, state) for _, _, city, state in chosen]


def _unique_names(rng: np.random.Generator, make, n: int) -> list[str]:
    """``n`` distinct names from ``make(rng)``, none a substring of another (lookups stay exact)."""
    names: list[str] = []
    tries = 0
    while len(names) < n and tries < n * 50:
        tries += 1
        cand = make(rng)
        if any(cand in other or other in cand for other in names):
            continue
        names.append(cand)
    return names


def _two_words(first: Sequence[str], second: Sequence[str]) -> Callable[[np.random.Generator], str]:
    """A ``make`` for ``_unique_names``: a word of ``first``, a space, a word of ``second``."""
    return lambda r: f"{first[r.integers(len(first))]} {second[r.integers(len(second))]}"


def generate_tables(
    seed: int = 0,
    n_cities: int | None = None,
    start_date: str = "2022-03-01",
    n_days: int = 31,
) -> dict[str, pd.DataFrame]:
    """All six tables, deterministic in ``(seed, n_cities, start_date, n_days)``."""
    rng = np.random.default_rng(np.random.PCG64([seed, 20220301]))
    chosen = select_cities(n_cities)
    city_names = [c for c, _ in chosen]
    states = [s for _, s in chosen]
    rank_in_state = {}
    for state in dict.fromkeys(states):
        for rank, city in enumerate(c for c, s in chosen if s == state):
            rank_in_state[city] = rank
    n = len(chosen)
    lat = np.empty(n)
    lon = np.empty(n)
    for i, state in enumerate(states):
        clat, clon, spread, _ = STATES[state]
        lat[i] = clat + rng.uniform(-spread, spread)
        lon[i] = clon + rng.uniform(-spread, spread) * 1.3
    size = np.exp(-0.45 * np.array([rank_in_state[c] for c in city_names])) * rng.lognormal(0, 0.35, n)
    size = np.clip(size / size.max() * 1.4, 0.05, 1.0)

    km = _haversine_km(lat[:, None], lon[:, None], lat[None, :], lon[None, :])
    tables = {
        schema.CITIES: pd.DataFrame({"City": city_names, "State": states}),
        schema.FLIGHTS: _flights(rng, city_names, size, km, start_date, n_days),
        schema.DISTANCE: _distance(rng, city_names, km),
    }
    acc: list[dict] = []
    rest: list[dict] = []
    attr: list[dict] = []
    for i, city in enumerate(city_names):
        acc += _accommodations(rng, city, size[i])
        rest += _restaurants(rng, city, size[i])
        attr += _attractions(rng, city, states[i], lat[i], lon[i], size[i])
    tables[schema.ACCOMMODATIONS] = pd.DataFrame(acc)
    tables[schema.RESTAURANTS] = pd.DataFrame(rest)
    tables[schema.ATTRACTIONS] = pd.DataFrame(attr)
    return {name: tables[name][schema.COLUMNS[name]] for name in schema.COLUMNS}


def _haversine_km(lat1, lon1, lat2, lon2) -> np.ndarray:
    p1, p2 = np.radians(lat1), np.radians(lat2)
    dphi = p2 - p1
    dl = np.radians(lon2 - lon1)
    a = np.sin(dphi / 2) ** 2 + np.cos(p1) * np.cos(p2) * np.sin(dl / 2) ** 2
    return 2 * 6371.0 * np.arcsin(np.sqrt(np.clip(a, 0, 1)))


def _flights(rng, cities, size, km, start_date: str, n_days: int) -> pd.DataFrame:
    n = len(cities)
    pair_size = size[:, None] * size[None, :]
    p_route = np.clip(0.3 + 0.7 * pair_size, 0, 0.97)
    routes = (rng.random((n, n)) < p_route) & (km > 180)
    # every city reaches the two largest airports within reach (hub-and-spoke)
    hubs = np.argsort(-size)[: max(2, n // 15)]
    for i in range(n):
        reachable = [h for h in hubs if h != i and km[i, h] > 180]
        for h in sorted(reachable, key=lambda h: km[i, h])[:2]:
            routes[i, h] = routes[h, i] = True
    o_idx, d_idx = np.nonzero(routes)
    lam = 0.6 + 2.5 * pair_size[o_idx, d_idx]
    counts = rng.poisson(lam[:, None], size=(len(o_idx), n_days))
    route_rep = np.repeat(np.arange(len(o_idx)), counts.sum(axis=1))
    day_rep = np.concatenate([np.repeat(np.arange(n_days), row) for row in counts]) if len(o_idx) else []
    day_rep = np.asarray(day_rep, dtype=np.int64)
    total = len(route_rep)
    dep = rng.integers(5 * 60, 23 * 60 + 30, total)
    order = np.lexsort((dep, day_rep, d_idx[route_rep], o_idx[route_rep]))  # sorted like the published table
    route_rep, day_rep, dep = route_rep[order], day_rep[order], dep[order]
    oi, di = o_idx[route_rep], d_idx[route_rep]
    dist_km = km[oi, di]
    elapsed = np.maximum(40, dist_km / 780 * 60 + 35 + rng.normal(0, 8, total)).astype(np.int64)
    arr = (dep + elapsed) % 1440
    price = np.round(45 + 0.075 * dist_km * rng.lognormal(0, 0.3, total) + rng.normal(0, 12, total))
    price = np.clip(price, 35, 2500).astype(np.int64)
    base = int(rng.integers(1_000_000, 2_000_000))
    numbers = base + rng.permutation(total) * 7 + rng.integers(0, 7, total)
    start = dt.date.fromisoformat(start_date)
    dates = [(start + dt.timedelta(days=d)).isoformat() for d in range(n_days)]
    hhmm = _hhmm_table()
    # repeated strings are stored dictionary-encoded (categoricals): small parquet, fast loads
    df = pd.DataFrame(
        {
            "Flight Number": pd.array(np.char.add("F", numbers.astype(str)), dtype=object),
            "Price": price,
            "DepTime": pd.Categorical.from_codes(dep, categories=hhmm),
            "ArrTime": pd.Categorical.from_codes(arr, categories=hhmm),
            "ActualElapsedTime": pd.Categorical.from_codes(
                elapsed, categories=_elapsed_table(int(elapsed.max(initial=0)) + 1)
            ),
            "FlightDate": pd.Categorical.from_codes(day_rep, categories=dates),
            "OriginCityName": pd.Categorical.from_codes(oi, categories=list(cities)),
            "DestCityName": pd.Categorical.from_codes(di, categories=list(cities)),
            "Distance": np.round(dist_km * 0.621371, 0),
        }
    )
    return df


def _distance(rng, cities, km) -> pd.DataFrame:
    n = len(cities)
    o_idx, d_idx = np.nonzero((km > 0) & (km < 2100))
    keep = rng.random(len(o_idx)) > 0.03
    o_idx, d_idx = o_idx[keep], d_idx[keep]
    road_km = np.round(km[o_idx, d_idx] * rng.uniform(1.12, 1.35, len(o_idx))).astype(np.int64)
    minutes = np.round(road_km / rng.uniform(78, 98, len(o_idx)) * 60).astype(np.int64)
    duration = np.array([_road_duration(m) for m in minutes], dtype=object)
    distance = np.array([f"{k:,} km" for k in road_km], dtype=object)
    names = np.array(cities, dtype=object)
    frames = []
    for mode in ROAD_MODES:
        cost = np.array([road_cost(k, mode) for k in road_km], dtype=object)
        cost[minutes >= 1440] = None  # TravelPlanner: no cost for legs of a day or more
        frames.append(
            pd.DataFrame(
                {
                    "origin": names[o_idx],
                    "destination": names[d_idx],
                    "mode": mode,
                    "duration": duration,
                    "distance": distance,
                    "cost": pd.array(cost, dtype="Int64"),
                }
            )
        )
    del n
    return pd.concat(frames, ignore_index=True)


def _accommodations(rng, city: str, size: float) -> list[dict]:
    count = int(rng.integers(8, 13) + 26 * size)
    types = rng.choice(len(ROOM_TYPES), size=count, p=[0.5, 0.42, 0.08])
    rows = []
    names: list[str] = []
    for t in types:
        room = ROOM_TYPES[t]
        kinds = _ACC_KIND[room]
        while True:
            name = (
                f"{_ACC_ADJ[rng.integers(len(_ACC_ADJ))]} {kinds[rng.integers(len(kinds))]} "
                f"{_ACC_WHERE[rng.integers(len(_ACC_WHERE))]}"
            )
            if not any(name in o or o in name for o in names):
                break
        names.append(name)
        mu = {"Entire home/apt": 5.55, "Private room": 4.85, "Shared room": 4.25}[room]
        price = float(np.clip(round(rng.lognormal(mu + 0.35 * size, 0.45)), 25, 1200))
        rules = [
            rule
            for rule, p in zip(HOUSE_RULES, (0.5, 0.42, 0.28, 0.22, 0.35), strict=True)
            if rng.random() < p
        ]
        if not rules:
            rules = [HOUSE_RULES[int(rng.integers(len(HOUSE_RULES)))]]
        occ_hi = {"Entire home/apt": 9, "Private room": 4, "Shared room": 3}[room]
        rows.append(
            {
                "NAME": name,
                "price": price,
                "room type": room,
                "house_rules": " & ".join(rules),
                "minimum nights": float(rng.choice([1, 1, 1, 1, 2, 2, 2, 3, 4, 5, 7, 10, 30])),
                "maximum occupancy": int(rng.integers(1 if room != "Entire home/apt" else 2, occ_hi)),
                "review rate number": float(rng.choice([1, 2, 3, 4, 5], p=[0.05, 0.1, 0.2, 0.3, 0.35])),
                "city": city,
            }
        )
    return rows


def _restaurants(rng, city: str, size: float) -> list[dict]:
    count = int(rng.integers(14, 20) + 50 * size)
    names = _unique_names(rng, _two_words(_REST_FIRST, _REST_SECOND), count)
    tags, weights = zip(*_CUISINE_TAGS, strict=True)
    w = np.array(weights) / sum(weights)
    rows = []
    for name in names:
        k = int(rng.integers(1, 5))
        cuisines = [tags[i] for i in sorted(rng.choice(len(tags), size=k, replace=False, p=w))]
        cost = int(np.clip(round(rng.lognormal(3.6 + 0.1 * k, 0.4)), 10, 110))
        rating = 0.0 if rng.random() < 0.08 else float(np.clip(round(rng.normal(3.8, 0.45), 1), 2.0, 4.9))
        rows.append(
            {
                "Name": name,
                "Average Cost": cost,
                "Cuisines": ", ".join(cuisines),
                "Aggregate Rating": rating,
                "City": city,
            }
        )
    return rows


def _attractions(rng, city: str, state: str, lat: float, lon: float, size: float) -> list[dict]:
    count = int(rng.integers(6, 10) + 22 * size)
    names = _unique_names(rng, _two_words(_ATTR_FIRST, _ATTR_SECOND), count)
    rows = []
    for name in names:
        slug = "".join(ch for ch in name.lower() if ch.isalnum())
        rows.append(
            {
                "Name": name,
                "Latitude": round(float(lat + rng.normal(0, 0.05)), 6),
                "Longitude": round(float(lon + rng.normal(0, 0.05)), 6),
                "Address": f"{int(rng.integers(1, 9999))} {_STREETS[rng.integers(len(_STREETS))]} "
                f"{_STREET_KIND[rng.integers(len(_STREET_KIND))]}, {city}, {state} {int(rng.integers(10000, 99999))}, USA",
                "Phone": f"({int(rng.integers(201, 989))}) {int(rng.integers(200, 999))}-{int(rng.integers(0, 9999)):04d}",
                "Website": f"https://www.{slug}.com" if rng.random() < 0.85 else "Unknown",
                "City": city,
            }
        )
    return rows
