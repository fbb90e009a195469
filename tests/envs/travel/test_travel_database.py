"""The generated database (schema, distributions, determinism, cache) and the CSV loader."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from turngym.envs.travel.database import (
    TravelDB,
    build_database,
    get_database,
    load_parquet_dir,
    load_travelplanner_csv,
)
from turngym.envs.travel.generate import generate_tables
from turngym.envs.travel.schema import COLUMNS, HOUSE_RULES, ROOM_TYPES


def test_the_states_table_loads_from_its_data_file():
    """50 states with US centroids and 304 cities, each city in one state only, in the file's order
    (the generated database depends on that order)."""
    from turngym.envs.travel.cities import STATES, STATES_FILE, all_cities

    assert STATES_FILE.is_file() and len(STATES) == 50
    assert list(STATES)[:2] == ["Alabama", "Alaska"] and list(STATES)[-1] == "Wyoming"
    assert STATES["Alabama"] == (
        32.8,
        -86.8,
        1.6,
        ("Birmingham", "Montgomery", "Mobile", "Huntsville", "Dothan"),
    )
    for lat, lon, spread, cities in STATES.values():
        assert 18 < lat < 72 and -170 < lon < -60 and 0 < spread <= 4 and cities
    pairs = all_cities()
    assert len(pairs) == 304 and len({city for city, _ in pairs}) == 304


@pytest.fixture(scope="module")
def full_tables():
    return generate_tables(seed=0)


def test_full_database_schema_and_size(full_tables):
    for name, cols in COLUMNS.items():
        assert list(full_tables[name].columns) == cols
    cities = full_tables["cities"]
    assert len(cities) >= 300 and cities["City"].is_unique
    assert cities["State"].nunique() == 50
    assert len(full_tables["flights"]) > 50_000
    assert full_tables["flights"]["Flight Number"].is_unique
    for table, col in (("accommodations", "city"), ("restaurants", "City"), ("attractions", "City")):
        per_city = full_tables[table].groupby(col).size()
        assert set(per_city.index) == set(cities["City"]) and per_city.min() >= 6


def test_realistic_distributions(full_tables):
    fl = full_tables["flights"]
    assert fl["Price"].between(35, 2500).all() and 100 < fl["Price"].median() < 600
    assert fl["DepTime"].str.match(r"^\d\d:\d\d$").all() and fl["ArrTime"].str.match(r"^\d\d:\d\d$").all()
    assert fl["ActualElapsedTime"].str.match(r"^\d+ hours \d+ minutes$").all()
    # longer flights cost more on average
    assert fl["Price"].corr(fl["Distance"]) > 0.5
    acc = full_tables["accommodations"]
    assert set(acc["room type"]) == set(ROOM_TYPES)
    shares = acc["room type"].value_counts(normalize=True)
    assert shares["Entire home/apt"] > shares["Private room"] > shares["Shared room"]
    by_type = acc.groupby("room type")["price"].median()
    assert by_type["Entire home/apt"] > by_type["Private room"] > by_type["Shared room"]
    rules = {r for rs in acc["house_rules"] for r in rs.split(" & ")}
    assert rules == set(HOUSE_RULES)
    assert acc["minimum nights"].min() >= 1 and (acc["minimum nights"] > 2).any()
    assert acc["review rate number"].between(1, 5).all()
    rest = full_tables["restaurants"]
    assert rest["Average Cost"].between(10, 110).all()
    assert rest["Aggregate Rating"].between(0, 5).all()
    tags = {t for c in rest["Cuisines"] for t in c.split(", ")}
    assert {"Chinese", "American", "Italian", "Mexican", "Indian", "Mediterranean", "French"} <= tags
    dist = full_tables["distance"]
    assert set(dist["mode"]) == {"self-driving", "taxi"}
    long_legs = dist[dist["duration"].str.contains("day")]
    assert len(long_legs) and long_legs["cost"].isna().all()


def test_names_are_parseable():
    tables = generate_tables(seed=5, n_cities=40)
    for table, col in (("accommodations", "NAME"), ("restaurants", "Name"), ("attractions", "Name")):
        names = tables[table][col]
        assert not names.str.contains(r"[,;()]").any()
    # no name is a substring of another name in the same city (TravelPlanner matches by substring)
    for _, group in tables["restaurants"].groupby("City"):
        names = list(group["Name"])
        assert not any(a != b and a in b for a in names for b in names)


def test_generation_is_deterministic():
    a = generate_tables(seed=1, n_cities=30, n_days=5)
    b = generate_tables(seed=1, n_cities=30, n_days=5)
    c = generate_tables(seed=2, n_cities=30, n_days=5)
    for name in COLUMNS:
        pd.testing.assert_frame_equal(a[name], b[name])
    assert not a["restaurants"].equals(c["restaurants"])


def test_cache_is_keyed_and_reused(tmp_path):
    path = build_database(seed=4, n_cities=25, n_days=4, cache_dir=tmp_path)
    meta = json.loads((path / "meta.json").read_text())
    assert meta["seed"] == 4 and meta["n_cities"] == 25 and meta["rows"]["cities"] == 25
    mtime = (path / "flights.parquet").stat().st_mtime_ns
    assert build_database(seed=4, n_cities=25, n_days=4, cache_dir=tmp_path) == path
    assert (path / "flights.parquet").stat().st_mtime_ns == mtime
    assert build_database(seed=5, n_cities=25, n_days=4, cache_dir=tmp_path) != path
    db1 = get_database(4, 25, 4, cache_dir=tmp_path)
    assert get_database(4, 25, 4, cache_dir=tmp_path) is db1
    assert load_parquet_dir(path).summary() == db1.summary()
    with pytest.raises(FileNotFoundError):
        load_parquet_dir(tmp_path / "nothing")


def test_lookups(small_db):
    city = small_db.cities[0]
    assert small_db.canonical_city(city.upper()) == city
    assert small_db.canonical_city("Atlantis") is None
    rest = small_db.restaurants(city)[0]
    assert small_db.find("restaurants", rest["Name"], city) == [rest]
    assert small_db.find("restaurants", rest["Name"], "Atlantis") == []
    row = small_db.tables["flights"].iloc[123]
    o, d, date = row["OriginCityName"], row["DestCityName"], row["FlightDate"]
    found = small_db.flights(o, d, date)
    assert row["Flight Number"] in [f["Flight Number"] for f in found]
    assert all((f["OriginCityName"], f["DestCityName"], f["FlightDate"]) == (o, d, date) for f in found)
    assert small_db.flights(o, d, "1999-01-01") == [] and small_db.flights("Atlantis", d, date) == []
    flight = found[0]
    assert small_db.flight_by_number(flight["Flight Number"]) == flight
    assert small_db.flight_by_number("F0") is None
    assert small_db.road(o, d, "Self-Driving") == small_db.road(o, d, "self-driving")
    assert small_db.road(o, d, "bicycle") is None


def write_travelplanner_csvs(root, tables: dict[str, pd.DataFrame]) -> None:
    """Write tables the way the published database stores them."""
    for sub in (
        "flights",
        "accommodations",
        "restaurants",
        "attractions",
        "googleDistanceMatrix",
        "background",
    ):
        (root / sub).mkdir(parents=True, exist_ok=True)
    tables["flights"].rename(columns={"Flight Number": "Unnamed: 0"}).assign(Extra="x").to_csv(
        root / "flights/clean_Flights_2022.csv", index=False
    )
    tables["accommodations"].to_csv(root / "accommodations/clean_accommodations_2022.csv", index=False)
    rest = tables["restaurants"].copy()
    rest.loc[len(rest)] = ["Broken Row", None, "Cafe", 3.0, "Alpha"]  # a NaN row is dropped like upstream
    rest.to_csv(root / "restaurants/clean_restaurant_2022.csv", index=False)
    tables["attractions"].to_csv(root / "attractions/attractions.csv", index=False)
    dist = tables["distance"]
    dist = dist[dist["mode"] == "taxi"][["origin", "destination", "duration", "distance"]].assign(cost=None)
    dist.to_csv(root / "googleDistanceMatrix/distance.csv", index=False)
    (root / "background/citySet_with_states.txt").write_text(
        "\n".join(
            f"{c}\t{s}" for c, s in zip(tables["cities"]["City"], tables["cities"]["State"], strict=True)
        )
    )


def test_travelplanner_csv_loader(tmp_path, tiny_data):
    write_travelplanner_csvs(tmp_path, tiny_data)
    db = load_travelplanner_csv(tmp_path)
    assert isinstance(db, TravelDB) and db.meta["source"] == "travelplanner-csv"
    assert db.summary()["restaurants"] == len(tiny_data["restaurants"])  # NaN row dropped
    assert db.flight_by_number("F102")["DestCityName"] == "Beta"
    assert db.road("Home", "Alpha", "self-driving")["cost"] == 25  # int(500 * 0.05)
    assert db.road("Home", "Alpha", "taxi")["cost"] == 500
    assert db.road("Beta", "Home", "taxi")["cost"] is None  # "1 day 2 hours"
    assert db.state_cities["State S"] == ["Alpha", "Beta"]
    assert get_database(path=tmp_path).summary() == db.summary()
    with pytest.raises(FileNotFoundError, match="missing"):
        load_travelplanner_csv(tmp_path / "flights")
