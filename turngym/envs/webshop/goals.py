"""Shopping goals sampled from a target product, as WebShop samples them.

A goal names some of the target's attributes, one value of each of its options and a price
ceiling above its price, and says it in words: "i need a long sleeve cotton men's t-shirt in
navy, size large, and price lower than 30.00 dollars". The target product always satisfies its
goal, so the best reward is 1.0; other products may satisfy it too.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from turngym.envs.webshop.catalog import Catalog, Product
from turngym.envs.webshop.vocab import TYPES

#: WebShop's PRICE_RANGE: the price ceiling is the larger of two of the first four steps above the price
PRICE_RANGE = tuple(10.0 * i for i in range(1, 100))
_TYPE_BY_KEY = {t.key: t for t in TYPES}
_OPENERS = ("i need", "i'm looking for", "i want to buy", "find me", "i would like", "can you get me")


@dataclass
class Goal:
    """WebShop's goal fields (``asin``, ``attributes``, ``goal_options``, ``price_upper``, ...)."""

    asin: str
    name: str  # the target's title
    query: str
    category: str
    product_category: str
    attributes: list[str]
    goal_options: dict[str, str] | list[str]  # WebShop's human goals give a plain list
    price_upper: float
    instruction_text: str
    target_price: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _an(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


def _option_phrase(name: str, value: str) -> str:
    if name == "color":
        return f"in {value}"
    if name == "size":
        return (
            f"size {value}"
            if not any(c.isdigit() for c in value) or value.replace(".", "").isdigit()
            else value
        )
    if name in ("flavor", "scent"):
        return f"{value} {name}"
    if name == "model":
        return f"for {value}"
    return f"with {value} {name}"


def price_ceiling(price: float, rng: np.random.Generator) -> float:
    """WebShop's rule: two of the (at most) four ``PRICE_RANGE`` steps above ``price``, the larger one."""
    above = [p for p in PRICE_RANGE if p > price][:4]
    if len(above) < 2:
        return 1_000_000.0
    return float(max(rng.choice(above, size=2, replace=False)))


def option_values(goal_options: dict[str, str] | list[str]) -> list[str]:
    return list(goal_options.values()) if isinstance(goal_options, dict) else list(goal_options)


def sample_goal(product: Product, rng: np.random.Generator) -> Goal:
    """A goal whose target is ``product``."""
    t = _TYPE_BY_KEY[product.type]
    k = int(rng.integers(1, min(3, len(product.attributes)) + 1))
    attrs = [
        product.attributes[i] for i in sorted(rng.choice(len(product.attributes), size=k, replace=False))
    ]
    options = {name: values[int(rng.integers(len(values)))] for name, values in product.options.items()}
    price_upper = price_ceiling(product.price, rng)
    noun = next((n for n in t.nouns if n.lower() in product.title.lower()), t.nouns[0])
    pre = [a for a in attrs if not a.startswith(("for ", "with "))]
    post = [a for a in attrs if a.startswith(("for ", "with "))]
    head = " ".join(x for x in (", ".join(pre), t.modifier, noun) if x)
    phrase = f"{_OPENERS[int(rng.integers(len(_OPENERS)))]} {_an(head)} {head}"
    if post:
        phrase += " " + " ".join(post)
    opts = [_option_phrase(n, v) for n, v in options.items()]
    if opts:
        phrase += " " + ", ".join(opts)
    if price_upper < 1_000_000:
        phrase += f", and price lower than {price_upper:.2f} dollars"
    return Goal(
        asin=product.asin,
        name=product.title,
        query=product.query,
        category=product.category.split(" › ")[0],
        product_category=product.category,
        attributes=attrs,
        goal_options=options,
        price_upper=price_upper,
        instruction_text=phrase,
        target_price=product.price,
    )


def goal_for_index(catalog: Catalog, index: int, seed: int) -> Goal:
    """Goal number ``index`` of a goal set: target = a product drawn from ``(seed, index)``."""
    rng = np.random.default_rng([seed, index])
    product = catalog.product_at(int(rng.integers(len(catalog))))
    return sample_goal(product, rng)
