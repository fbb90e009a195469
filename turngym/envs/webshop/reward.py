"""WebShop's reward for a purchase (Yao et al. 2022, ``web_agent_site/engine/goal.py``).

    reward = (matched attributes + matched options + [price <= price_upper])
             / (|goal attributes| + |goal options| + 1)  x  r_type

* an attribute matches when some product attribute has ``fuzz.token_set_ratio > 85`` with it, or
  it appears verbatim in the product's title, bullet points or description;
* an option matches when a chosen option (colours normalised to a base colour) has
  ``token_set_ratio > 85`` with it;
* ``r_type`` is 1, 0.5, 0.1 or 0 from the query / category / title-noun match: 0.5 when none of
  (same query, >= 2 shared category levels, title-noun overlap > 0.2) holds, 0.1 when the overlap is
  below 0.1, and 0 when no goal noun is in the bought title.

WebShop finds title nouns with spaCy's tagger; here the catalog's own noun lexicon
(:data:`~turngym.envs.webshop.vocab.NOUNS`) and the product's brand (a proper noun) stand in for it.
"""

from __future__ import annotations

import re
from typing import Any

from rapidfuzz import fuzz

from turngym.envs.webshop.catalog import Product
from turngym.envs.webshop.goals import Goal, option_values
from turngym.envs.webshop.vocab import NOUNS

# WebShop's COLOR_SET, in its order (normalize_color returns the first one contained)
COLOR_SET = (
    "alabaster apricot aqua ash asphalt azure banana beige black blue blush bordeaux bronze brown burgundy camel camo "
    "caramel champagne charcoal cheetah chestnut chocolate christmas coffee cognac copper coral cranberry cream crystal "
    "dark denim eggplant elephant espresso fuchsia gold granite grape graphite grass gray green grey heather indigo "
    "ivory ivy khaki lavender lemon leopard light lilac lime magenta maroon mauve merlot midnight mint mocha multicolor "
    "mushroom mustard natural navy nude olive orange peach pewter pink plum purple rainbow red rose royal rust sand "
    "sapphire seashell silver skull slate steel stone stonewash sunflower tan taupe teal tiger turquoise violet walnut "
    "wheat white wine yellow"
).split()
MATCH_THRESHOLD = 85
#: ``Product.type`` of products imported from WebShop's files (their titles are not from our lexicon)
IMPORTED_TYPE = "webshop"
_STOP = frozenset(
    "a an and the for with of in on to by from pack set size inch inches ounce oz count pcs piece pieces men "
    "women men's women's kids girls boys unisex new x xl xxl s m l small medium large".split()
)


def normalize_color(text: str) -> str:
    """The first WebShop base colour contained in ``text``, else ``text``."""
    for color in COLOR_SET:
        if color in text:
            return color
    return text


def title_nouns(title: str, brand: str = "") -> list[str]:
    """The nouns of a generated title: words of the catalog's noun lexicon, and the brand."""
    words = re.findall(r"[a-z0-9][a-z0-9'\-.]*", title.lower())
    return [w for w in words if w in NOUNS or (brand and w == brand.lower())]


def content_words(title: str, brand: str = "") -> list[str]:
    """Stand-in for spaCy's noun tagging on imported titles: words minus stop, colour and size words."""
    words = re.findall(r"[a-z][a-z'\-]+", title.lower())
    return [w for w in words if w not in _STOP and w not in COLOR_SET]


def type_reward(product: Product, goal: Goal, goal_brand: str = "") -> dict[str, Any]:
    query_match = product.query == goal.query
    bought_cats = {x.strip() for x in product.category.split("›")}
    goal_cats = {x.strip() for x in goal.product_category.split("›")}
    category_match = len(bought_cats & goal_cats) >= 2
    nouns = content_words if product.type == IMPORTED_TYPE else title_nouns
    bought = nouns(product.title, product.brand)
    desired = nouns(goal.name, goal_brand)
    title_score = 0.2 if not desired else len(set(bought) & set(desired)) / len(set(desired))
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {
        "r_type": r_type,
        "query_match": query_match,
        "category_match": category_match,
        "title_score": title_score,
    }


def attribute_matches(product: Product, goal_attrs: list[str]) -> int:
    text = " ".join([product.title, *product.bullets, product.description]).lower()
    n = 0
    for g in goal_attrs:
        if any(fuzz.token_set_ratio(p, g) > MATCH_THRESHOLD for p in product.attributes) or g in text:
            n += 1
    return n


def option_matches(chosen: list[str], goal_options: list[str]) -> int:
    chosen_n = [normalize_color(o) for o in chosen]
    goal_n = [normalize_color(o) for o in goal_options]
    return sum(any(fuzz.token_set_ratio(p, g) > MATCH_THRESHOLD for p in chosen_n) for g in goal_n)


def webshop_reward(
    product: Product, chosen_options: dict[str, str], goal: Goal, *, goal_brand: str = ""
) -> tuple[float, dict[str, Any]]:
    """WebShop's reward of buying ``product`` with ``chosen_options`` for ``goal``, and its parts.

    ``goal_brand`` is the target product's brand (counted as a title noun, as spaCy tags brands).
    """
    rt = type_reward(product, goal, goal_brand)
    price_ok = product.price <= goal.price_upper if goal.price_upper > 0 else None
    n_attr = attribute_matches(product, goal.attributes)
    goal_opts = option_values(goal.goal_options)
    n_opt = option_matches(list(chosen_options.values()), goal_opts)
    total = (n_attr + n_opt + float(bool(price_ok))) / (len(goal.attributes) + len(goal_opts) + 1)
    reward = total * rt["r_type"]
    parts = {
        **rt,
        "r_att": n_attr / len(goal.attributes) if goal.attributes else None,
        "r_option": n_opt / len(goal_opts) if goal_opts else None,
        "r_price": price_ok,
        "n_attr_matches": n_attr,
        "n_option_matches": n_opt,
        "reward": reward,
    }
    return reward, parts
