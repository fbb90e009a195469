"""Load WebShop's published data files into the local shop: products, attributes and human goals.

WebShop (Yao et al. 2022) ships ``items_shuffle*.json`` (products: ``asin``, ``name``, ``category``,
``query``, ``product_category``, ``full_description``, ``small_description``, ``pricing``,
``customization_options``, ``average_rating``, ...), ``items_ins_v2*.json`` (per ASIN:
``attributes``) and ``items_human_ins.json`` (per ASIN: human instructions with
``instruction_attributes`` and ``instruction_options``). :func:`import_webshop` converts them the way
WebShop's ``load_products`` / ``get_human_goals`` do (options lower-cased with ``/`` -> `` | ``, the
first price of a range, goals without attributes dropped, price ceilings from ``PRICE_RANGE``)
into a catalog file plus a goal list, which :class:`~turngym.envs.webshop.env.WebShopEnv` serves
with ``catalog_path=`` and ``goals_path=``.

Title nouns for the type reward: WebShop tags them with spaCy; for imported titles (no lexicon)
:func:`~turngym.envs.webshop.reward.content_words` stands in (alphabetic words minus stop words, colours and size words).
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np

from turngym.envs.webshop.catalog import Product, write_catalog
from turngym.envs.webshop.goals import Goal, price_ceiling
from turngym.envs.webshop.reward import IMPORTED_TYPE


def _price(pricing: Any) -> float:
    if isinstance(pricing, (int, float)):
        return float(pricing)
    prices = [float(re.sub(r"[^\d.]", "", p) or 0) for p in str(pricing or "").split("$")[1:]]
    return prices[0] if prices else 100.0  # WebShop's default for a missing price


def _product(p: dict[str, Any], attrs: dict[str, Any]) -> Product:
    options: dict[str, list[str]] = {}
    for name, contents in (p.get("customization_options") or {}).items():
        if contents:
            options[name.lower()] = [str(c["value"]).strip().replace("/", " | ").lower() for c in contents]
    bullets = p.get("small_description") or []
    reviews = [
        {"title": str(r.get("title", "")), "body": str(r.get("body", r.get("text", ""))),
         "score": int(r.get("score", r.get("stars", 0)) or 0)}
        for r in (p.get("Reviews") or p.get("reviews") or [])
    ]  # fmt: skip
    rating = p.get("average_rating")
    return Product(
        asin=p["asin"],
        type=IMPORTED_TYPE,
        brand=str(p.get("brand") or ""),
        title=str(p.get("name") or ""),
        category=str(p.get("product_category") or p.get("category") or ""),
        query=str(p.get("query") or "").lower().strip(),
        price=_price(p.get("pricing")),
        rating=float(rating) if isinstance(rating, (int, float)) else 0.0,
        n_ratings=int(p.get("total_reviews") or 0) if str(p.get("total_reviews") or "0").isdigit() else 0,
        attributes=list(attrs.get(p["asin"], {}).get("attributes") or ["DUMMY_ATTR"]),
        options=options,
        bullets=bullets if isinstance(bullets, list) else [str(bullets)],
        description=str(p.get("full_description") or ""),
        reviews=reviews,
    )


def _read_json(path: str | Path | None) -> Any:
    return json.loads(Path(path).read_text()) if path else {}


def import_webshop(
    products_json: str | Path,
    out_dir: str | Path,
    *,
    attributes_json: str | Path | None = None,
    human_goals_json: str | Path | None = None,
    seed: int = 233,
) -> tuple[Path, Path]:
    """Convert WebShop's files; returns ``(catalog_path, goals_path)``.

    Goals are WebShop's human goals when ``human_goals_json`` is given (shuffled with ``seed``, as
    WebShop shuffles them before its test/dev/train split), otherwise one goal per product that has
    ``instruction_text``/``instruction_attributes`` in the attributes file.
    """
    raw = _read_json(products_json)
    attrs = _read_json(attributes_json)
    human = _read_json(human_goals_json)
    products, seen = [], set()
    for p in raw:
        asin = str(p.get("asin", ""))
        if asin in seen or asin == "nan" or len(asin) > 10 or not asin:
            continue
        seen.add(asin)
        products.append(_product(p, attrs))
    by_asin = {p.asin: p for p in products}
    top = {str(r.get("asin")): str(r.get("category") or "") for r in raw}
    rng = np.random.default_rng(seed)
    goals: list[Goal] = []
    for p in products:
        if human_goals_json:
            specs = [
                (g["instruction"], g.get("instruction_attributes") or [], g.get("instruction_options") or [])
                for g in human.get(p.asin, [])
            ]
        else:
            a = attrs.get(p.asin, {})
            specs = (
                [(a["instruction"], a.get("instruction_attributes") or [], [])]
                if a.get("instruction")
                else []
            )
        for text, g_attrs, g_opts in specs:
            if not g_attrs:
                continue  # WebShop drops goals without attributes
            upper = price_ceiling(p.price, rng)
            suffix = f", and price lower than {upper:.2f} dollars" if upper < 1_000_000 else ""
            goals.append(
                Goal(
                    asin=p.asin,
                    name=p.title,
                    query=p.query,
                    category=top[p.asin],
                    product_category=p.category,
                    attributes=list(g_attrs),
                    goal_options=list(g_opts) if not isinstance(g_opts, dict) else dict(g_opts),
                    price_upper=upper,
                    instruction_text=str(text).strip(".") + suffix,
                    target_price=p.price,
                    extra={"goal_brand": by_asin[p.asin].brand},
                )
            )
    order = rng.permutation(len(goals))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    catalog = out / "webshop-catalog.sqlite"
    catalog.unlink(missing_ok=True)
    with sqlite3.connect(catalog) as conn:
        write_catalog(conn, products)
    goals_path = out / "webshop-goals.json"
    goals_path.write_text(json.dumps([goals[i].to_dict() for i in order], indent=1))
    return catalog, goals_path


def load_goals(path: str | Path) -> list[Goal]:
    return [Goal(**g) for g in json.loads(Path(path).read_text())]
