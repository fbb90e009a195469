"""The shop's product catalog: generated from a seed into SQLite (with an FTS5 search index).

``build_catalog(seed, n)`` writes ``n`` products (default 12,000) spread over the product types
of :mod:`~turngym.envs.webshop.vocab`. A product has an ASIN-like id, a brand, a title built
from its brand, type and some of its attributes, WebShop's fields (category path, query,
attributes, bullet points, description, options with values, price, rating, reviews). The file is
cached under ``$TURNGYM_CACHE_DIR/webshop``; the same seed always gives the same catalog.

:class:`Catalog` reads it: ``search`` ranks products with SQLite's BM25 over title and text
(WebShop ranks with BM25 too), ``product`` loads one.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from turngym.core.cache import cache_root
from turngym.envs.browser.sites.storage import build_cached, connect
from turngym.envs.webshop.vocab import BRAND_SYLLABLES, TYPES, ProductType

CATALOG_VERSION = 1
DEFAULT_SIZE = 12_000
_ASIN_CHARS = np.array(list("ABCDEFGHJKLMNPQRSTUVWXYZ0123456789"))
_FILLERS = (
    "Designed for everyday use and built to last.",
    "Backed by our 30-day satisfaction guarantee.",
    "A customer favourite with thousands of happy buyers.",
    "Carefully tested for quality before it ships.",
    "Makes a thoughtful gift for friends and family.",
)
_REVIEWS = (
    ("Exactly as described", "Works great and arrived quickly. Would buy again."),
    ("Good value", "Solid quality for the price, a couple of small flaws."),
    ("Not for me", "It is fine but did not quite fit what I needed."),
    ("Love it", "Better than I expected, I ordered a second one."),
    ("Decent", "Does the job. Packaging could be better."),
)


@dataclass
class Product:
    """One catalog entry (WebShop's product fields)."""

    asin: str
    type: str
    brand: str
    title: str
    category: str
    query: str
    price: float
    rating: float
    n_ratings: int
    attributes: list[str]
    options: dict[str, list[str]]
    bullets: list[str]
    description: str
    reviews: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Product:
        return cls(**{f.name: _READ.get(f.name, _same)(row[f.name]) for f in fields(cls)})


#: the ``products`` table has a column per :class:`Product` field, of its name: the list and dict fields
#: are stored as JSON text, and read back through ``_READ`` with the numbers cast
_JSON_FIELDS = frozenset({"attributes", "options", "bullets", "reviews"})
_READ: dict[str, Callable[[Any], Any]] = {
    "price": float, "rating": float, "n_ratings": int, **dict.fromkeys(_JSON_FIELDS, json.loads)
}  # fmt: skip


def _same(value: Any) -> Any:
    return value


def _stored(p: Product) -> tuple[Any, ...]:
    """A product's ``products`` columns, in field order."""
    return tuple(
        json.dumps(getattr(p, f.name)) if f.name in _JSON_FIELDS else getattr(p, f.name) for f in fields(p)
    )


def _brand(rng: np.random.Generator) -> str:
    parts = rng.choice(len(BRAND_SYLLABLES), size=int(rng.integers(2, 4)), replace=True)
    return "".join(BRAND_SYLLABLES[i] for i in parts).capitalize()


def _title_case(text: str) -> str:
    return " ".join(w if w[:1].isdigit() else w[:1].upper() + w[1:] for w in text.split())


def _product(rng: np.random.Generator, t: ProductType, brand: str, asin: str) -> Product:
    n_attr = int(rng.integers(2, min(5, len(t.groups)) + 1))
    groups = rng.choice(len(t.groups), size=n_attr, replace=False)
    attributes = [str(t.groups[g][int(rng.integers(len(t.groups[g])))]) for g in sorted(groups)]
    options: dict[str, list[str]] = {}
    for name, values in t.options.items():
        k = int(rng.integers(min(2, len(values)), min(8, len(values)) + 1))
        picked = sorted(rng.choice(len(values), size=k, replace=False))
        options[name] = [values[i] for i in picked]
    noun = t.nouns[int(rng.integers(len(t.nouns)))]
    in_title = [a for a in attributes if not a.startswith(("for ", "with "))][: int(rng.integers(1, 3))]
    title = " ".join(
        x for x in (brand, _title_case(t.modifier), _title_case(" ".join(in_title)), _title_case(noun)) if x
    )
    extra = [a for a in attributes if a not in in_title]
    if extra and rng.random() < 0.6:
        title += ", " + _title_case(extra[0])
    lo, hi = t.price
    price = float(np.floor(rng.uniform(lo, hi))) + float(rng.choice([0.99, 0.49, 0.95, 0.0]))
    bullets = [
        f"{a.upper() if len(a) < 5 else a.capitalize()}: {_FILLERS[int(rng.integers(len(_FILLERS)))]}"
        for a in attributes
    ]
    bullets.append(f"Brand: {brand}. {_FILLERS[int(rng.integers(len(_FILLERS)))]}")
    description = (
        f"The {brand} {noun} is a {', '.join(attributes[:-1]) + ' and ' + attributes[-1] if len(attributes) > 1 else attributes[0]}"
        f" {noun} from our {t.category.split(' › ')[-1].lower()} range. "
        + _FILLERS[int(rng.integers(len(_FILLERS)))]
    )
    reviews = []
    for _ in range(int(rng.integers(0, 4))):
        head, body = _REVIEWS[int(rng.integers(len(_REVIEWS)))]
        reviews.append({"title": head, "body": body, "score": int(rng.integers(2, 6))})
    return Product(
        asin=asin,
        type=t.key,
        brand=brand,
        title=title,
        category=t.category,
        query=t.query,
        price=round(price, 2),
        rating=round(float(rng.uniform(3.0, 5.0)), 1),
        n_ratings=int(rng.integers(0, 5000)),
        attributes=attributes,
        options=options,
        bullets=bullets,
        description=description,
        reviews=reviews,
    )


def generate_products(seed: int = 0, n: int = DEFAULT_SIZE) -> list[Product]:
    """``n`` products, deterministic in ``seed``, types in round robin, ~40 brands per type."""
    rng = np.random.default_rng(seed)
    brands = {t.key: [_brand(rng) for _ in range(40)] for t in TYPES}
    asins: set[str] = set()
    out = []
    for i in range(n):
        t = TYPES[i % len(TYPES)]
        while True:
            asin = "B0" + "".join(rng.choice(_ASIN_CHARS, size=8))
            if asin not in asins:
                asins.add(asin)
                break
        out.append(_product(rng, t, brands[t.key][int(rng.integers(40))], asin))
    return out


_SCHEMA = """
CREATE TABLE products (
  rowid INTEGER PRIMARY KEY, asin TEXT UNIQUE NOT NULL, type TEXT, brand TEXT, title TEXT, category TEXT,
  query TEXT, price REAL, rating REAL, n_ratings INTEGER, attributes TEXT, options TEXT, bullets TEXT,
  description TEXT, reviews TEXT);
CREATE VIRTUAL TABLE products_fts USING fts5(title, body, tokenize='porter unicode61');
"""


def write_catalog(conn: sqlite3.Connection, products: list[Product]) -> None:
    conn.executescript(_SCHEMA)
    names = [f.name for f in fields(Product)]
    conn.executemany(
        f"INSERT INTO products (rowid, {', '.join(names)}) VALUES ({', '.join('?' * (len(names) + 1))})",
        [(i + 1, *_stored(p)) for i, p in enumerate(products)],
    )
    conn.executemany(
        "INSERT INTO products_fts(rowid, title, body) VALUES (?,?,?)",
        [
            (i + 1, p.title, " ".join([p.category, *p.attributes, *p.bullets, p.description,
                                       *(v for vs in p.options.values() for v in vs)]))
            for i, p in enumerate(products)
        ],
    )  # fmt: skip


def build_catalog(seed: int = 0, n: int = DEFAULT_SIZE, *, directory: str | Path | None = None) -> Path:
    """The path of the cached catalog for ``(seed, n)``, generated on first use (~2 s for 12k)."""
    root = Path(directory) if directory is not None else cache_root() / "webshop"
    path = root / f"catalog-v{CATALOG_VERSION}-s{seed}-n{n}.sqlite"
    return build_cached(path, lambda conn: write_catalog(conn, generate_products(seed, n)))


def fts_query(text: str) -> str:
    """Free text -> an FTS5 query that ORs the words (never a syntax error)."""
    words = re.findall(r"[a-z0-9]+", text.lower())
    return " OR ".join(f'"{w}"' for w in dict.fromkeys(words))


class Catalog:
    """Read access to a catalog file (one short-lived read-only connection per call; thread-safe)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"no catalog at {self.path}")

    def __len__(self) -> int:
        with connect(self.path, readonly=True) as conn:
            return int(conn.execute("SELECT count(*) FROM products").fetchone()[0])

    def search(self, text: str, limit: int = 50) -> list[tuple[str, str, float]]:
        """BM25-ranked ``(asin, title, price)`` for free text (title weighted 3x)."""
        q = fts_query(text)
        if not q:
            return []
        with connect(self.path, readonly=True) as conn:
            rows = conn.execute(
                "SELECT p.asin, p.title, p.price FROM products_fts f JOIN products p ON p.rowid = f.rowid "
                "WHERE products_fts MATCH ? ORDER BY bm25(products_fts, 3.0, 1.0), p.rowid LIMIT ?",
                (q, limit),
            ).fetchall()
        return [(r[0], r[1], float(r[2])) for r in rows]

    def product(self, asin: str) -> Product | None:
        with connect(self.path, readonly=True) as conn:
            row = conn.execute("SELECT * FROM products WHERE asin = ?", (asin,)).fetchone()
        return Product.from_row(row) if row else None

    def product_at(self, index: int) -> Product:
        """The ``index``-th product (0-based, insertion order)."""
        with connect(self.path, readonly=True) as conn:
            row = conn.execute("SELECT * FROM products WHERE rowid = ?", (index + 1,)).fetchone()
        if row is None:
            raise IndexError(index)
        return Product.from_row(row)
