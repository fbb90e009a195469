"""``TravelDB``: the sandbox database, its on-disk cache and the loader for TravelPlanner's CSVs.

* ``get_database(seed=0)`` builds the synthetic database once (see :mod:`.generate`), stores
  it as parquet under ``<cache>/travel/db-v{DB_VERSION}-s{seed}-c{n_cities}-d{n_days}/``
  and loads it from there afterwards (one copy per process, shared by every env).
  The cache root is :func:`turngym.core.cache.cache_root`.
* ``load_travelplanner_csv(root)`` reads the published database directory
  (``flights/clean_Flights_2022.csv``, ``accommodations/clean_accommodations_2022.csv``,
  ``restaurants/clean_restaurant_2022.csv``, ``attractions/attractions.csv``,
  ``googleDistanceMatrix/distance.csv``, ``background/citySet_with_states.txt``).

Lookups are indexed (dicts of row positions), so a tool call or a plan check costs
microseconds to a few milliseconds whatever the table sizes.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from turngym.core.cache import cache_root
from turngym.envs.travel.schema import (
    ACCOMMODATIONS,
    ATTRACTIONS,
    CITIES,
    COLUMNS,
    DISTANCE,
    FLIGHTS,
    RESTAURANTS,
    ROAD_MODES,
    TABLES,
    road_cost,
)

DB_VERSION = 3
_LOCK = threading.Lock()
_LOADED: dict[str, TravelDB] = {}


def normalize_mode(mode: str) -> str | None:
    """``"driving"``, ``"Self-driving"``, ``"self_driving"`` -> ``"self-driving"``; ``"Taxi"`` -> ``"taxi"``."""
    low = str(mode).strip().lower().replace("_", "-").replace(" ", "-")
    if low in ("self-driving", "driving", "selfdriving", "self-drive", "car"):
        return "self-driving"
    if low == "taxi":
        return "taxi"
    return None


class TravelDB:
    """The six TravelPlanner tables with the indexes the tools and the evaluator need."""

    def __init__(self, tables: dict[str, pd.DataFrame], meta: dict[str, Any] | None = None):
        missing = [t for t in TABLES if t not in tables]
        if missing:
            raise ValueError(f"missing tables: {missing}")
        for name, cols in COLUMNS.items():
            absent = [c for c in cols if c not in tables[name].columns]
            if absent:
                raise ValueError(f"table {name!r} lacks columns {absent}")
        self.tables = {name: tables[name][COLUMNS[name]].reset_index(drop=True) for name in TABLES}
        self.meta = dict(meta or {})
        cities = self.tables[CITIES]
        self.city_state: dict[str, str] = dict(zip(cities["City"], cities["State"], strict=True))
        self.state_cities: dict[str, list[str]] = defaultdict(list)
        for city, state in self.city_state.items():
            self.state_cities[state].append(city)
        self._states_lower = {s.lower(): s for s in self.state_cities}
        self._cities_lower = {c.lower(): c for c in self.city_state}

        self._flight_records: dict[int, dict[str, Any]] = {}
        self._text_cache: dict[tuple[Any, ...], str] = {}

    # ------------------------------------------------- indexes (built on first use)
    @functools.cached_property
    def _flight_index(self) -> tuple[dict[str, int], dict[str, int], np.ndarray, np.ndarray]:
        """(city -> code, date -> code, sorted (origin, destination, date) codes, row order)."""
        fl = self.tables[FLIGHTS]
        cities = pd.Index(
            sorted(set(_categories(fl["OriginCityName"])) | set(_categories(fl["DestCityName"])))
        )
        dates = pd.Index(sorted(_categories(fl["FlightDate"])))
        o, d, t = (
            _codes(fl[c], idx)
            for c, idx in (("OriginCityName", cities), ("DestCityName", cities), ("FlightDate", dates))
        )
        code = (o * len(cities) + d) * max(len(dates), 1) + t
        order = np.argsort(code, kind="stable")
        return (
            {c: i for i, c in enumerate(cities)},
            {x: i for i, x in enumerate(dates)},
            code[order],
            order,
        )

    def _flight_rows(self, origin: str, destination: str, date: str) -> np.ndarray:
        cities, dates, codes, order = self._flight_index
        o, d, t = cities.get(origin), cities.get(destination), dates.get(date)
        if o is None or d is None or t is None:
            return order[:0]
        c = (o * len(cities) + d) * max(len(dates), 1) + t
        return order[np.searchsorted(codes, c, "left") : np.searchsorted(codes, c, "right")]

    @functools.cached_property
    def _flight_number(self) -> pd.Index:
        return pd.Index(self.tables[FLIGHTS]["Flight Number"].astype(str).tolist())

    @functools.cached_property
    def dates(self) -> list[str]:
        """The flight dates the database covers, sorted."""
        return sorted(_categories(self.tables[FLIGHTS]["FlightDate"]))

    @functools.cached_property
    def _road(self) -> dict[tuple[str, str, str], dict[str, Any]]:
        index = {}
        for rec in _records(self.tables[DISTANCE]):
            cost = rec["cost"]
            rec["cost"] = None if cost is None or pd.isna(cost) else int(cost)
            index[(rec["origin"], rec["destination"], rec["mode"])] = rec
        return index

    @functools.cached_property
    def _by_city(self) -> dict[str, dict[str, list[dict[str, Any]]]]:
        out = {}
        for table, col in ((ACCOMMODATIONS, "city"), (RESTAURANTS, "City"), (ATTRACTIONS, "City")):
            groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
            name_col = "NAME" if table == ACCOMMODATIONS else "Name"
            for rec in _records(self.tables[table]):
                rec[name_col] = str(rec[name_col])
                groups[rec[col]].append(rec)
            out[table] = dict(groups)
        return out

    @functools.cached_property
    def _name_index(self) -> dict[str, dict[tuple[str, str], dict[str, Any]]]:
        return {
            table: {
                (r["NAME" if table == ACCOMMODATIONS else "Name"], city): r
                for city, rs in g.items()
                for r in rs
            }
            for table, g in self._by_city.items()
        }

    # ---------------------------------------------------------------- names
    @property
    def cities(self) -> list[str]:
        return list(self.city_state)

    def canonical_city(self, city: str) -> str | None:
        """The database spelling of a city (case-insensitive), or None."""
        return self._cities_lower.get(str(city).strip().lower())

    def canonical_state(self, state: str) -> str | None:
        return self._states_lower.get(str(state).strip().lower())

    # -------------------------------------------------------------- queries
    def flights(self, origin: str, destination: str, date: str) -> list[dict[str, Any]]:
        return [self._flight_record(int(i)) for i in self._flight_rows(origin, destination, date)]

    def _flight_record(self, i: int) -> dict[str, Any]:
        rec = self._flight_records.get(i)
        if rec is None:
            row = self.tables[FLIGHTS].iloc[i]
            rec = {c: _native(row[c]) for c in COLUMNS[FLIGHTS]}
            self._flight_records[i] = rec
        return rec

    def destinations(self, origin: str, date: str) -> list[str]:
        """The cities with a direct flight from ``origin`` on ``date``."""
        cities, dates, codes, _ = self._flight_index
        o, t = cities.get(origin), dates.get(date)
        if o is None or t is None:
            return []
        nd = max(len(dates), 1)
        lo, hi = np.searchsorted(codes, [o * len(cities) * nd, (o + 1) * len(cities) * nd])
        block = codes[lo:hi]
        dests = np.unique(block[block % nd == t] // nd - o * len(cities))
        names = list(cities)
        return [names[i] for i in dests]

    def flight_by_number(self, number: str) -> dict[str, Any] | None:
        idx = self._flight_number
        key = str(number).strip()
        if key not in idx:
            return None
        loc = idx.get_loc(key)
        if not isinstance(loc, int):  # duplicated numbers (published data): the first row
            loc = int(pd.Series(range(len(idx)))[loc].iloc[0])
        return self._flight_record(loc)

    def road(self, origin: str, destination: str, mode: str) -> dict[str, Any] | None:
        """The distance-matrix row (``cost`` None for legs of a day or more), or None."""
        m = normalize_mode(mode)
        return None if m is None else self._road.get((origin, destination, m))

    def accommodations(self, city: str) -> list[dict[str, Any]]:
        return self._by_city[ACCOMMODATIONS].get(city, [])

    def restaurants(self, city: str) -> list[dict[str, Any]]:
        return self._by_city[RESTAURANTS].get(city, [])

    def attractions(self, city: str) -> list[dict[str, Any]]:
        return self._by_city[ATTRACTIONS].get(city, [])

    def find(self, table: str, name: str, city: str) -> list[dict[str, Any]]:
        """Rows of ``table`` in ``city`` whose name contains ``name`` (TravelPlanner's match).

        An exact name match comes back alone, so a name that is a prefix of another is not
        ambiguous.
        """
        exact = self._name_index[table].get((name, city))
        if exact is not None:
            return [exact]
        key = "NAME" if table == ACCOMMODATIONS else "Name"
        return [r for r in self._by_city[table].get(city, []) if name and name in r[key]]

    # ----------------------------------------------------------- rendering
    def table_text(self, kind: str, *key: str) -> str:
        """A compact pipe-separated table of one lookup (cached per key)."""
        ck = (kind, *key)
        text = self._text_cache.get(ck)
        if text is None:
            if kind == FLIGHTS:
                rows, cols = self.flights(*key), COLUMNS[FLIGHTS]
            else:
                rows = self._by_city[kind].get(key[0], [])
                cols = [c for c in COLUMNS[kind] if c not in ("city", "City")]
            text = render_table(rows, cols)
            if len(self._text_cache) > 50_000:
                self._text_cache.clear()
            self._text_cache[ck] = text
        return text

    def summary(self) -> dict[str, int]:
        return {name: len(df) for name, df in self.tables.items()}


def _categories(col: pd.Series) -> list[Any]:
    """The distinct values of a column (its categories when categorical)."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        return col.cat.categories.tolist()
    return col.unique().tolist()


def _codes(col: pd.Series, index: pd.Index) -> np.ndarray:
    """Positions of a column's values in ``index`` (fast path for categoricals)."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        mapping = np.append(index.get_indexer(col.cat.categories), -1)
        return mapping[col.cat.codes.to_numpy()].astype(np.int64)
    return index.get_indexer(col).astype(np.int64)


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """``df.to_dict("records")`` through ``tolist`` (much faster on Arrow-backed string columns)."""
    cols = list(df.columns)
    return [dict(zip(cols, vals, strict=True)) for vals in zip(*(df[c].tolist() for c in cols), strict=True)]


def _native(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def render_table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float) and v.is_integer():
            return str(int(v))
        return str(v)

    lines = [" | ".join(cols)]
    lines.extend(" | ".join(fmt(r[c]) for c in cols) for r in rows)
    return "\n".join(lines)


# ------------------------------------------------------------------ storage
def save_tables(tables: dict[str, pd.DataFrame], path: str | Path, meta: dict[str, Any]) -> Path:
    """Write the tables as parquet plus ``meta.json``, atomically (a temp dir renamed into place)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=path.parent))
    try:
        for name in TABLES:
            tables[name][COLUMNS[name]].to_parquet(tmp / f"{name}.parquet", index=False)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
        try:
            tmp.rename(path)
        except OSError:  # another process finished first: keep its copy
            if not (path / "meta.json").exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def load_parquet_dir(path: str | Path) -> TravelDB:
    path = Path(path)
    meta_file = path / "meta.json"
    if not meta_file.exists():
        raise FileNotFoundError(f"no travel database at {path} (meta.json missing)")
    tables = {name: pd.read_parquet(path / f"{name}.parquet") for name in TABLES}
    return TravelDB(tables, json.loads(meta_file.read_text()))


def database_dir(seed: int, n_cities: int | None, n_days: int, cache_dir: str | Path | None = None) -> Path:
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    return root / "travel" / f"db-v{DB_VERSION}-s{seed}-c{n_cities or 'all'}-d{n_days}"


def build_database(
    seed: int = 0,
    n_cities: int | None = None,
    n_days: int = 31,
    cache_dir: str | Path | None = None,
    force: bool = False,
) -> Path:
    """Generate the database for ``seed`` into the cache (unless present); return its folder."""
    from turngym.envs.travel.generate import generate_tables

    path = database_dir(seed, n_cities, n_days, cache_dir)
    if (path / "meta.json").exists() and not force:
        return path
    if force and path.exists():
        shutil.rmtree(path)
    start = time.perf_counter()
    tables = generate_tables(seed, n_cities=n_cities, n_days=n_days)
    meta = {
        "version": DB_VERSION,
        "source": "generated",
        "seed": seed,
        "n_cities": len(tables[CITIES]),
        "n_days": n_days,
        "rows": {k: len(v) for k, v in tables.items()},
        "generation_s": round(time.perf_counter() - start, 3),
    }
    return save_tables(tables, path, meta)


def get_database(
    seed: int = 0,
    n_cities: int | None = None,
    n_days: int = 31,
    cache_dir: str | Path | None = None,
    path: str | Path | None = None,
) -> TravelDB:
    """The database for these arguments, built on first use and shared within the process.

    ``path`` selects a folder explicitly: a parquet folder written by :func:`save_tables`,
    or TravelPlanner's published ``database`` folder of CSV files.
    """
    if path is not None:
        folder = Path(path).expanduser().resolve()
    else:
        folder = database_dir(seed, n_cities, n_days, cache_dir).resolve()
    key = str(folder)
    with _LOCK:
        db = _LOADED.get(key)
        if db is not None:
            return db
        if path is None:
            build_database(seed, n_cities, n_days, cache_dir)
            db = load_parquet_dir(folder)
        elif (folder / "meta.json").exists():
            db = load_parquet_dir(folder)
        else:
            db = load_travelplanner_csv(folder)
        _LOADED[key] = db
        return db


# --------------------------------------------------------- published CSVs
_CSV_FILES = {
    FLIGHTS: "flights/clean_Flights_2022.csv",
    ACCOMMODATIONS: "accommodations/clean_accommodations_2022.csv",
    RESTAURANTS: "restaurants/clean_restaurant_2022.csv",
    ATTRACTIONS: "attractions/attractions.csv",
    DISTANCE: "googleDistanceMatrix/distance.csv",
    CITIES: "background/citySet_with_states.txt",
}
_KM = re.compile(r"[\d,.]+")


def load_travelplanner_csv(root: str | Path) -> TravelDB:
    """Read TravelPlanner's published ``database`` folder (the files of ``_CSV_FILES``).

    Like the published tools, rows with missing values are dropped. The distance matrix
    (``origin, destination, duration, distance``) becomes one row per road mode with
    TravelPlanner's costs.
    """
    root = Path(root)
    absent = [rel for rel in _CSV_FILES.values() if not (root / rel).exists()]
    if absent:
        raise FileNotFoundError(
            f"{root} is not a TravelPlanner database folder; missing: {', '.join(absent)}"
        )
    tables: dict[str, pd.DataFrame] = {}
    for name in (FLIGHTS, ACCOMMODATIONS, RESTAURANTS, ATTRACTIONS):
        df = pd.read_csv(root / _CSV_FILES[name])
        if name == FLIGHTS and "Flight Number" not in df.columns and "Unnamed: 0" in df.columns:
            df = df.rename(columns={"Unnamed: 0": "Flight Number"})
        tables[name] = df[COLUMNS[name]].dropna().reset_index(drop=True)
    tables[FLIGHTS]["Flight Number"] = tables[FLIGHTS]["Flight Number"].astype(str)
    tables[RESTAURANTS]["Name"] = tables[RESTAURANTS]["Name"].astype(str)
    tables[ACCOMMODATIONS]["NAME"] = tables[ACCOMMODATIONS]["NAME"].astype(str)
    tables[DISTANCE] = _distance_from_csv(pd.read_csv(root / _CSV_FILES[DISTANCE]))
    pairs = [
        line.split("\t")
        for line in (root / _CSV_FILES[CITIES]).read_text(encoding="utf-8").splitlines()
        if "\t" in line
    ]
    tables[CITIES] = pd.DataFrame([(c.strip(), s.strip()) for c, s in pairs], columns=COLUMNS[CITIES])
    meta = {"version": DB_VERSION, "source": "travelplanner-csv", "path": str(root)}
    return TravelDB(tables, meta)


def _distance_from_csv(raw: pd.DataFrame) -> pd.DataFrame:
    raw = raw.dropna(subset=["origin", "destination", "duration", "distance"])
    frames = []
    for mode in ROAD_MODES:
        rows = []
        for o, d, dur, dist in zip(
            raw["origin"], raw["destination"], raw["duration"], raw["distance"], strict=True
        ):
            m = _KM.search(str(dist))
            km = float(m.group(0).replace(",", "")) if m else None
            cost = None if km is None or "day" in str(dur) else road_cost(km, mode)
            rows.append((o, d, mode, str(dur), str(dist), cost))
        df = pd.DataFrame(rows, columns=COLUMNS[DISTANCE])
        df["cost"] = pd.array(df["cost"], dtype="Int64")
        frames.append(df)
    return pd.concat(frames, ignore_index=True)
