"""Importing WebShop's published file formats (products, attributes, human goals)."""

from __future__ import annotations

import json

import pytest

from turngym.envs.webshop.catalog import Catalog
from turngym.envs.webshop.loader import import_webshop, load_goals
from turngym.envs.webshop.reward import content_words, webshop_reward

PRODUCTS = [
    {
        "asin": "B07XYZ1234", "name": "Acme Men's Slim Fit Long Sleeve Dress Shirt", "category": "fashion",
        "query": "Men's Dress Shirts", "product_category": "Clothing, Shoes & Jewelry › Men › Clothing › Shirts",
        "full_description": "A crisp shirt for the office. Machine wash.", "small_description": ["100% cotton", "slim fit"],
        "pricing": "$24.99", "average_rating": 4.4, "total_reviews": "12",
        "customization_options": {"Color": [{"value": "Navy", "image": None}, {"value": "White/Blue", "image": None}],
                                  "Size": [{"value": "Large"}, {"value": "X-Large"}]},
        "Reviews": [{"title": "Nice", "body": "fits well", "stars": 5}],
    },
    {
        "asin": "B08ABC5678", "name": "Brewco Organic Dark Roast Ground Coffee", "category": "grocery",
        "query": "ground coffee", "product_category": "Grocery & Gourmet Food › Beverages › Coffee",
        "full_description": "Smooth and bold.", "small_description": "fair trade", "pricing": "$9.50 $14.00",
        "customization_options": {"Size": [{"value": "12 Ounce"}, {"value": "2 Pound"}]},
    },
    {"asin": "B08ABC5678", "name": "duplicate", "customization_options": None},
    {"asin": "nan", "name": "broken"},
]  # fmt: skip
ATTRS = {
    "B07XYZ1234": {"attributes": ["slim fit", "long sleeve", "machine wash"]},
    "B08ABC5678": {"attributes": ["organic"]},
}
HUMAN = {
    "B07XYZ1234": [
        {"instruction": "i need a slim fit long sleeve shirt in navy, size large.", "instruction_attributes": ["slim fit", "long sleeve"],
         "instruction_options": ["navy", "large"]},
        {"instruction": "no attributes here", "instruction_attributes": [], "instruction_options": []},
    ],
    "B08ABC5678": [{"instruction": "organic dark roast coffee, 2 pound", "instruction_attributes": ["organic"],
                    "instruction_options": ["2 pound"]}],
}  # fmt: skip


@pytest.fixture
def imported(tmp_path):
    for name, data in (("items.json", PRODUCTS), ("attrs.json", ATTRS), ("human.json", HUMAN)):
        (tmp_path / name).write_text(json.dumps(data))
    return import_webshop(
        tmp_path / "items.json", tmp_path / "out", attributes_json=tmp_path / "attrs.json",
        human_goals_json=tmp_path / "human.json",
    )  # fmt: skip


def test_import_converts_products_like_webshop(imported):
    catalog_path, goals_path = imported
    cat = Catalog(catalog_path)
    assert len(cat) == 2  # duplicate and 'nan' ASINs dropped
    shirt = cat.product("B07XYZ1234")
    assert shirt.options == {"color": ["navy", "white | blue"], "size": ["large", "x-large"]}
    assert shirt.price == 24.99 and shirt.attributes == ["slim fit", "long sleeve", "machine wash"]
    assert shirt.category.startswith("Clothing, Shoes & Jewelry ›") and shirt.query == "men's dress shirts"
    assert shirt.reviews[0]["score"] == 5 and shirt.bullets == ["100% cotton", "slim fit"]
    coffee = cat.product("B08ABC5678")
    assert coffee.price == 9.5 and coffee.bullets == ["fair trade"]
    assert cat.search("organic coffee")[0][0] == "B08ABC5678"


def test_import_builds_human_goals(imported):
    catalog_path, goals_path = imported
    goals = load_goals(goals_path)
    assert len(goals) == 2  # the goal without attributes is dropped, as in WebShop
    shirt_goal = next(g for g in goals if g.asin == "B07XYZ1234")
    assert shirt_goal.goal_options == ["navy", "large"] and shirt_goal.price_upper in (40.0, 50.0, 60.0)
    assert shirt_goal.instruction_text.endswith(
        f", and price lower than {shirt_goal.price_upper:.2f} dollars"
    )
    assert "size large, and price" in shirt_goal.instruction_text  # the trailing period is stripped
    cat = Catalog(catalog_path)
    shirt = cat.product("B07XYZ1234")
    assert webshop_reward(shirt, {"color": "navy", "size": "large"}, shirt_goal)[0] == 1.0
    r, parts = webshop_reward(shirt, {"color": "white | blue", "size": "large"}, shirt_goal)
    assert r == pytest.approx(4 / 5) and parts["n_option_matches"] == 1
    r, parts = webshop_reward(cat.product("B08ABC5678"), {}, shirt_goal)
    assert parts["r_type"] == 0.0 and r == 0.0
    assert content_words("Acme Men's Slim Fit Navy Shirt, Large") == ["acme", "slim", "fit", "shirt"]


@pytest.mark.slow
@pytest.mark.browser
def test_env_serves_imported_files(imported):
    import turngym

    catalog_path, goals_path = imported
    env = turngym.make("web-shop-v0", split="all", catalog_path=catalog_path, goals_path=goals_path)
    try:
        for i in range(2):
            obs, info = env.reset(seed=0, options={"goal_index": i})
            total = 0.0
            for _ in range(6):
                obs, r, term, trunc, info = env.step(env.expert_action())
                total += r
                if term or trunc:
                    break
            assert term and total == 1.0, info.get("purchase")
        with pytest.raises(ValueError, match="out of range"):
            env.reset(seed=0, options={"goal_index": 5})
    finally:
        env.close()
