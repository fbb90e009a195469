"""Shared fixtures: a small generated database (built once per session) and a hand-made one."""

from __future__ import annotations

import pandas as pd
import pytest

from turngym.envs.travel.database import TravelDB, get_database
from turngym.envs.travel.schema import ACCOMMODATIONS, COLUMNS, FLIGHTS

SMALL = {"db_seed": 3, "n_cities": 150, "n_days": 14}


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("travel-cache"))


@pytest.fixture(scope="session")
def small_db(cache_dir) -> TravelDB:
    return get_database(SMALL["db_seed"], SMALL["n_cities"], SMALL["n_days"], cache_dir=cache_dir)


@pytest.fixture(scope="session")
def env_kwargs(cache_dir, small_db) -> dict:
    return {**SMALL, "cache_dir": cache_dir}


def tiny_tables() -> dict[str, pd.DataFrame]:
    """A hand-made world: Home (State H) and Alpha, Beta (State S), with known rows."""
    flights = pd.DataFrame(
        [
            ["F100", 200, "08:00", "10:00", "2 hours 0 minutes", "2022-03-01", "Home", "Alpha", 500.0],
            ["F101", 250, "09:00", "11:00", "2 hours 0 minutes", "2022-03-03", "Alpha", "Home", 500.0],
            ["F102", 150, "07:00", "08:00", "1 hours 0 minutes", "2022-03-03", "Alpha", "Beta", 200.0],
            ["F103", 300, "18:00", "20:00", "2 hours 0 minutes", "2022-03-05", "Beta", "Home", 600.0],
        ],
        columns=COLUMNS[FLIGHTS],
    )
    acc = pd.DataFrame(
        [
            ["Sunny loft", 100.0, "Entire home/apt", "No smoking", 1.0, 4, 4.0, "Alpha"],
            ["Long stay flat", 80.0, "Private room", "No pets & No parties", 5.0, 2, 3.0, "Alpha"],
            ["Shared bunk", 30.0, "Shared room", "No visitors", 1.0, 1, 3.0, "Alpha"],
            ["Beta house", 120.0, "Entire home/apt", "No children under 10", 2.0, 6, 5.0, "Beta"],
        ],
        columns=COLUMNS[ACCOMMODATIONS],
    )
    rest = pd.DataFrame(
        [
            ["Pasta Place", 20, "Italian, Pizza", 4.1, "Alpha"],
            ["Dragon Bowl", 15, "Chinese", 3.9, "Alpha"],
            ["Taco Stand", 10, "Mexican, Fast Food", 4.0, "Alpha"],
            ["Curry Corner", 25, "Indian", 4.5, "Alpha"],
            ["Bistro Beta", 30, "French, Cafe", 4.2, "Beta"],
            ["Beta Diner", 12, "American", 3.5, "Beta"],
            ["Beta Grill", 18, "American, BBQ", 3.7, "Beta"],
            ["Beta Noodles", 14, "Chinese, Thai", 4.0, "Beta"],
            ["Home Cafe", 9, "Cafe, Mediterranean", 3.0, "Home"],
        ],
        columns=["Name", "Average Cost", "Cuisines", "Aggregate Rating", "City"],
    )
    attr = pd.DataFrame(
        [
            ["Alpha Museum", 1.0, 2.0, "1 Main St, Alpha", "(555) 111-1111", "https://a.example", "Alpha"],
            ["Alpha Park", 1.0, 2.0, "2 Main St, Alpha", "(555) 111-1112", "https://b.example", "Alpha"],
            ["Beta Tower", 3.0, 4.0, "3 Main St, Beta", "(555) 111-1113", "https://c.example", "Beta"],
            ["Beta Zoo", 3.0, 4.0, "4 Main St, Beta", "(555) 111-1114", "https://d.example", "Beta"],
        ],
        columns=["Name", "Latitude", "Longitude", "Address", "Phone", "Website", "City"],
    )
    dist = pd.DataFrame(
        [
            ["Home", "Alpha", m, "5 hours 0 mins", "500 km", 25 if m == "self-driving" else 500]
            for m in ("self-driving", "taxi")
        ]
        + [
            ["Alpha", "Home", m, "5 hours 0 mins", "500 km", 25 if m == "self-driving" else 500]
            for m in ("self-driving", "taxi")
        ]
        + [
            ["Alpha", "Beta", m, "2 hours 0 mins", "200 km", 10 if m == "self-driving" else 200]
            for m in ("self-driving", "taxi")
        ]
        + [["Beta", "Home", m, "1 day 2 hours", "2,600 km", None] for m in ("self-driving", "taxi")],
        columns=["origin", "destination", "mode", "duration", "distance", "cost"],
    )
    dist["cost"] = pd.array(dist["cost"], dtype="Int64")
    cities = pd.DataFrame(
        [["Home", "State H"], ["Alpha", "State S"], ["Beta", "State S"]], columns=["City", "State"]
    )
    return {
        "flights": flights,
        "accommodations": acc,
        "restaurants": rest,
        "attractions": attr,
        "distance": dist,
        "cities": cities,
    }


@pytest.fixture
def tiny_data() -> dict[str, pd.DataFrame]:
    return tiny_tables()


@pytest.fixture
def tiny_db() -> TravelDB:
    return TravelDB(tiny_tables())
