"""The shop's catalog, goals and WebShop's reward (no browser)."""

from __future__ import annotations

import dataclasses
import json
import sqlite3

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turngym.envs.webshop.catalog import DEFAULT_SIZE, Catalog, build_catalog, fts_query, generate_products
from turngym.envs.webshop.goals import goal_for_index, sample_goal
from turngym.envs.webshop.reward import normalize_color, title_nouns, webshop_reward
from turngym.envs.webshop.vocab import TYPES


def test_generation_is_deterministic_and_varied():
    a, b = generate_products(seed=5, n=300), generate_products(seed=5, n=300)
    assert [dataclasses.asdict(p) for p in a] == [dataclasses.asdict(p) for p in b]
    assert generate_products(seed=6, n=50)[0].asin != a[0].asin
    assert len({p.asin for p in a}) == 300
    assert {p.type for p in a} == {t.key for t in TYPES}
    assert len({p.title for p in a}) > 250
    for p in a:
        assert p.brand in p.title
        assert 2 <= len(p.attributes) <= 5 and p.options and p.price > 0
        assert all(len(v) >= 1 for v in p.options.values())
        t = next(t for t in TYPES if t.key == p.type)
        assert t.price[0] <= p.price <= t.price[1] + 1
        for group in t.groups:  # attributes of one group exclude each other
            assert len(set(group) & set(p.attributes)) <= 1


def test_default_catalog_has_at_least_10k_products():
    cat = Catalog(build_catalog())
    assert len(cat) == DEFAULT_SIZE >= 10_000
    with sqlite3.connect(cat.path) as conn:
        n_types = conn.execute("SELECT count(DISTINCT type) FROM products").fetchone()[0]
        n_brands = conn.execute("SELECT count(DISTINCT brand) FROM products").fetchone()[0]
    assert n_types == len(TYPES) and n_brands > 400


def test_catalog_cache_is_reused(tmp_path):
    p1 = build_catalog(seed=1, n=40, directory=tmp_path)
    mtime = p1.stat().st_mtime_ns
    assert build_catalog(seed=1, n=40, directory=tmp_path) == p1 and p1.stat().st_mtime_ns == mtime
    assert not list(tmp_path.glob("*.tmp"))


def test_search_finds_products_by_title(small_catalog):
    for i in range(0, 1500, 97):
        p = small_catalog.product_at(i)
        hits = [a for a, _, _ in small_catalog.search(p.title)]
        assert p.asin in hits, p.title
        assert len(hits) <= 50


@pytest.mark.parametrize("text", ["", "   ", '"', "AND OR NOT", "*", "()", "x' OR 1=1 --", "NEAR(a b)"])
def test_search_never_raises_on_odd_text(small_catalog, text):
    assert isinstance(small_catalog.search(text), list)
    assert fts_query("a b a") == '"a" OR "b"'


def test_product_lookup(small_catalog):
    p = small_catalog.product_at(0)
    assert small_catalog.product(p.asin) == p
    assert small_catalog.product("B0NOPE") is None
    with pytest.raises(IndexError):
        small_catalog.product_at(10**6)


def test_goals_are_satisfied_by_their_target(small_catalog):
    for i in range(150):
        g = goal_for_index(small_catalog, i, seed=3)
        target = small_catalog.product(g.asin)
        assert target is not None
        assert g.price_upper > target.price
        assert set(g.attributes) <= set(target.attributes) and 1 <= len(g.attributes) <= 3
        assert set(g.goal_options) == set(target.options)
        assert all(v in target.options[k] for k, v in g.goal_options.items())
        assert all(v in g.instruction_text for v in g.goal_options.values())
        assert f"{g.price_upper:.2f} dollars" in g.instruction_text
        reward, parts = webshop_reward(target, g.goal_options, g, goal_brand=target.brand)
        assert reward == 1.0, (g.instruction_text, parts)
    assert goal_for_index(small_catalog, 7, 3) == goal_for_index(small_catalog, 7, 3)
    assert json.dumps(goal_for_index(small_catalog, 7, 3).to_dict())


def _goal_and_target(small_catalog, i=11):
    g = goal_for_index(small_catalog, i, seed=3)
    return g, small_catalog.product(g.asin)


def test_reward_counts_each_part(small_catalog):
    g, p = _goal_and_target(small_catalog)
    n = len(g.attributes) + len(g.goal_options) + 1
    # no options chosen: only attributes and price match
    r, parts = webshop_reward(p, {}, g, goal_brand=p.brand)
    assert r == pytest.approx((len(g.attributes) + 1) / n) and parts["n_option_matches"] == 0
    # too expensive: the price term drops
    pricey = dataclasses.replace(p, price=g.price_upper + 1)
    r, parts = webshop_reward(pricey, g.goal_options, g, goal_brand=p.brand)
    assert r == pytest.approx((n - 1) / n) and parts["r_price"] is False
    # attributes missing everywhere
    bare = dataclasses.replace(
        p, attributes=[], title=p.brand + " " + p.title.split()[-1], bullets=[], description=""
    )
    r, parts = webshop_reward(bare, g.goal_options, g, goal_brand=p.brand)
    assert parts["n_attr_matches"] == 0


def test_type_factor_levels(small_catalog):
    g, p = _goal_and_target(small_catalog)
    other = next(
        small_catalog.product_at(i)
        for i in range(1500)
        if small_catalog.product_at(i).type != p.type
        and not set(title_nouns(small_catalog.product_at(i).title)) & set(title_nouns(p.title, p.brand))
    )
    r, parts = webshop_reward(other, {}, g, goal_brand=p.brand)
    assert parts["r_type"] == 0.0 and r == 0.0  # no goal noun in the bought title
    # a title sharing a few nouns, another category and query: 0.5 (overlap <= 0.2 but >= 0.1) or 0.1
    nouns = title_nouns(g.name, p.brand)
    common = next(n for n in nouns if n != p.brand.lower())  # a lexicon noun, not the brand
    one = dataclasses.replace(other, title=f"{other.title} {common}")
    share = 1 / len(set(nouns))
    r, parts = webshop_reward(one, {}, g, goal_brand=p.brand)
    expected = 1.0 if share > 0.2 else (0.5 if share >= 0.1 else 0.1)
    assert parts["r_type"] == expected


def test_color_normalisation_matches_webshop():
    assert normalize_color("heather grey") == "grey"
    assert normalize_color("navy") == "navy"
    assert normalize_color("dark wash") == "ash"  # WebShop matches substrings in list order: w-ASH
    assert normalize_color("size 10") == "size 10"


def test_sample_goal_uses_rng(small_catalog):
    p = small_catalog.product_at(5)
    goals = {sample_goal(p, np.random.default_rng(s)).instruction_text for s in range(20)}
    assert len(goals) > 5


@settings(max_examples=60)
@given(i=st.integers(0, 1499), j=st.integers(0, 1499), pick=st.lists(st.integers(0, 20), max_size=3))
def test_reward_is_bounded_and_best_for_the_target(small_catalog, i, j, pick):
    g = goal_for_index(small_catalog, i, seed=3)
    target = small_catalog.product(g.asin)
    other = small_catalog.product_at(j)
    chosen = {k: v[pick[n] % len(v)] for n, (k, v) in enumerate(other.options.items()) if n < len(pick)}
    r, _ = webshop_reward(other, chosen, g, goal_brand=target.brand)
    assert 0.0 <= r <= 1.0
    assert r <= webshop_reward(target, g.goal_options, g, goal_brand=target.brand)[0]
