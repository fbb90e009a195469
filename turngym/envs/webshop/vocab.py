"""The shop's product vocabulary: product types with their category path, nouns, attribute groups,
option values and price ranges (WebShop's five top categories: fashion, beauty, grocery, home, electronics).

Attributes inside one group exclude each other (a shirt is not both long and short sleeve).
``NOUNS`` is the lexicon the type reward uses in place of WebShop's spaCy noun tagging: the
catalog's titles are generated from these words, so the nouns of a title are known exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

APPAREL_COLORS = [
    "black", "white", "navy", "heather grey", "charcoal", "red", "royal blue", "olive green",
    "burgundy", "khaki", "light pink", "teal", "mustard yellow", "purple", "beige",
]  # fmt: skip
APPAREL_SIZES = ["x-small", "small", "medium", "large", "x-large", "xx-large"]
SHOE_SIZES = ["6", "6.5", "7", "7.5", "8", "8.5", "9", "9.5", "10", "10.5", "11", "12"]
HOME_COLORS = ["walnut", "espresso", "white", "natural oak", "black", "grey", "rustic brown", "cherry"]
TECH_COLORS = ["black", "white", "silver", "midnight blue", "rose gold", "space grey", "mint green", "red"]


@dataclass(frozen=True)
class ProductType:
    key: str
    category: str  # WebShop-style path, parts joined by " › "
    query: str  # the search query the product was "scraped" with (WebShop's ``query``)
    nouns: tuple[str, ...]  # head nouns a title ends with
    modifier: str  # words before the noun in titles and instructions ("men's"), may be ""
    groups: tuple[tuple[str, ...], ...]  # attribute groups; one attribute at most per group
    options: dict[str, tuple[str, ...]]
    price: tuple[float, float]


def _t(key, category, query, nouns, modifier, groups, options, price) -> ProductType:
    return ProductType(
        key, category, query, tuple(nouns), modifier, tuple(tuple(g) for g in groups),
        {k: tuple(v) for k, v in options.items()}, price,
    )  # fmt: skip


_F = "Clothing, Shoes & Jewelry"
_B = "Beauty & Personal Care"
_G = "Grocery & Gourmet Food"
_H = "Home & Kitchen"
_E = "Electronics"

TYPES: tuple[ProductType, ...] = (
    _t(
        "tshirt",
        f"{_F} › Men › Clothing › Shirts › T-Shirts",
        "men's t-shirts",
        ["t-shirt", "tee shirt"],
        "men's",
        [
            ["long sleeve", "short sleeve"],
            ["slim fit", "relaxed fit", "regular fit"],
            ["cotton", "polyester", "linen blend"],
            ["machine wash", "hand wash"],
            ["crew neck", "v-neck"],
            ["moisture wicking"],
            ["quick dry"],
        ],
        {"color": APPAREL_COLORS, "size": APPAREL_SIZES},
        (8, 40),
    ),
    _t(
        "dress",
        f"{_F} › Women › Clothing › Dresses",
        "women's dresses",
        ["dress", "midi dress", "maxi dress"],
        "women's",
        [
            ["long sleeve", "short sleeve", "sleeveless"],
            ["floral print", "solid color", "polka dot"],
            ["v-neck", "round neck"],
            ["machine wash", "hand wash"],
            ["with pockets"],
            ["high waist"],
        ],
        {"color": APPAREL_COLORS, "size": APPAREL_SIZES},
        (18, 80),
    ),
    _t(
        "hoodie",
        f"{_F} › Men › Clothing › Fashion Hoodies & Sweatshirts",
        "men's hoodies",
        ["hoodie", "sweatshirt"],
        "men's",
        [
            ["pullover", "full zip"],
            ["fleece lined", "lightweight"],
            ["cotton", "polyester"],
            ["machine wash", "hand wash"],
            ["kangaroo pocket"],
            ["relaxed fit", "slim fit"],
        ],
        {"color": APPAREL_COLORS, "size": APPAREL_SIZES},
        (15, 65),
    ),
    _t(
        "running_shoes",
        f"{_F} › Men › Shoes › Athletic › Running",
        "men's running shoes",
        ["running shoes", "sneakers"],
        "men's",
        [
            ["lightweight"],
            ["breathable mesh", "knit upper"],
            ["non slip", "rubber sole"],
            ["memory foam"],
            ["arch support"],
        ],
        {"color": APPAREL_COLORS, "size": SHOE_SIZES},
        (25, 120),
    ),
    _t(
        "jeans",
        f"{_F} › Women › Clothing › Jeans",
        "women's jeans",
        ["jeans", "denim jeans"],
        "women's",
        [
            ["high waist", "mid rise", "low rise"],
            ["skinny", "straight leg", "bootcut", "wide leg"],
            ["stretch"],
            ["machine wash"],
            ["button closure", "zipper closure"],
        ],
        {
            "color": ["dark wash", "light wash", "black", "stonewash blue", "white", "grey"],
            "size": ["0", "2", "4", "6", "8", "10", "12", "14", "16"],
        },
        (20, 90),
    ),
    _t(
        "shampoo",
        f"{_B} › Hair Care › Shampoo & Conditioner › Shampoos",
        "shampoo",
        ["shampoo", "shampoo and conditioner set"],
        "",
        [
            ["sulfate free"],
            ["paraben free"],
            ["for dry hair", "for oily hair", "for color treated hair", "for curly hair"],
            ["natural ingredients"],
            ["cruelty free"],
            ["argan oil", "tea tree oil", "coconut oil", "biotin"],
        ],
        {
            "size": ["8 fl oz", "12 fl oz", "16.9 fl oz", "33.8 fl oz"],
            "scent": ["coconut", "lavender", "citrus", "eucalyptus mint", "unscented", "rose"],
        },
        (6, 35),
    ),
    _t(
        "lipstick",
        f"{_B} › Makeup › Lips › Lipstick",
        "lipstick",
        ["lipstick", "liquid lipstick"],
        "",
        [
            ["long lasting"],
            ["matte finish", "satin finish", "glossy finish"],
            ["cruelty free"],
            ["paraben free"],
            ["vegan"],
            ["waterproof"],
        ],
        {"color": ["ruby red", "nude", "coral", "berry", "mauve", "hot pink", "plum", "brick red"]},
        (5, 30),
    ),
    _t(
        "moisturizer",
        f"{_B} › Skin Care › Face › Creams & Moisturizers",
        "face moisturizer",
        ["face moisturizer", "face cream", "night cream"],
        "",
        [
            ["for sensitive skin", "for dry skin", "for oily skin"],
            ["oil free"],
            ["fragrance free"],
            ["hyaluronic acid", "vitamin c", "retinol"],
            ["spf 30", "spf 50"],
            ["anti aging"],
        ],
        {"size": ["1.7 oz", "2.5 oz", "3.4 oz"]},
        (9, 60),
    ),
    _t(
        "hair_dryer",
        f"{_B} › Hair Care › Styling Tools › Hair Dryers",
        "hair dryer",
        ["hair dryer", "blow dryer"],
        "",
        [
            ["ionic"],
            ["lightweight"],
            ["fast drying"],
            ["low noise"],
            ["diffuser included", "concentrator nozzle"],
            ["foldable"],
        ],
        {"color": TECH_COLORS},
        (18, 110),
    ),
    _t(
        "coffee",
        f"{_G} › Beverages › Coffee › Ground Coffee",
        "ground coffee",
        ["ground coffee", "whole bean coffee"],
        "",
        [
            ["dark roast", "medium roast", "light roast"],
            ["organic"],
            ["fair trade"],
            ["decaf"],
            ["gluten free"],
            ["single origin"],
        ],
        {
            "size": ["12 ounce", "2 pound", "5 pound"],
            "flavor": ["original", "french vanilla", "hazelnut", "mocha", "caramel"],
        },
        (7, 45),
    ),
    _t(
        "protein_bars",
        f"{_G} › Snack Foods › Bars › Protein Bars",
        "protein bars",
        ["protein bars", "snack bars"],
        "",
        [["gluten free"], ["low sugar"], ["high protein"], ["keto friendly"], ["non gmo"], ["plant based"]],
        {
            "flavor": [
                "chocolate chip",
                "peanut butter",
                "cookies and cream",
                "salted caramel",
                "almond",
                "birthday cake",
            ],
            "size": ["12 count", "24 count", "36 count"],
        },
        (10, 50),
    ),
    _t(
        "tea",
        f"{_G} › Beverages › Tea › Herbal Tea",
        "herbal tea",
        ["herbal tea", "green tea", "tea bags"],
        "",
        [["organic"], ["caffeine free"], ["non gmo"], ["individually wrapped"], ["kosher"], ["gluten free"]],
        {
            "flavor": ["chamomile", "peppermint", "ginger", "lemon", "hibiscus", "jasmine"],
            "size": ["20 count", "50 count", "100 count"],
        },
        (4, 25),
    ),
    _t(
        "olive_oil",
        f"{_G} › Pantry Staples › Cooking Oils › Olive Oil",
        "olive oil",
        ["olive oil", "extra virgin olive oil"],
        "",
        [["cold pressed"], ["organic"], ["non gmo"], ["kosher"], ["glass bottle", "tin can"]],
        {"size": ["500 ml", "750 ml", "1 liter", "3 liter"]},
        (8, 55),
    ),
    _t(
        "office_chair",
        f"{_H} › Furniture › Home Office Furniture › Chairs",
        "office chair",
        ["office chair", "desk chair", "gaming chair"],
        "",
        [
            ["ergonomic"],
            ["lumbar support"],
            ["adjustable height"],
            ["mesh back", "leather seat"],
            ["easy assembly"],
            ["with armrests", "armless"],
        ],
        {"color": HOME_COLORS},
        (45, 300),
    ),
    _t(
        "coffee_table",
        f"{_H} › Furniture › Living Room Furniture › Tables › Coffee Tables",
        "coffee table",
        ["coffee table", "side table"],
        "",
        [
            ["solid wood", "engineered wood", "metal frame"],
            ["easy assembly"],
            ["storage space"],
            ["mid century", "industrial", "farmhouse"],
            ["round", "rectangular"],
        ],
        {"color": HOME_COLORS},
        (40, 260),
    ),
    _t(
        "sheets",
        f"{_H} › Bedding › Sheets & Pillowcases › Sheet & Pillowcase Sets",
        "bed sheets",
        ["sheet set", "bed sheets"],
        "",
        [
            ["deep pocket"],
            ["machine washable"],
            ["cotton", "microfiber", "bamboo"],
            ["wrinkle free"],
            ["breathable"],
            ["hypoallergenic"],
        ],
        {
            "color": ["white", "grey", "navy", "sage green", "ivory", "blush pink", "charcoal"],
            "size": ["twin", "full", "queen", "king", "california king"],
        },
        (20, 110),
    ),
    _t(
        "lamp",
        f"{_H} › Lighting › Lamps & Shades › Table Lamps",
        "table lamp",
        ["table lamp", "desk lamp"],
        "",
        [["dimmable"], ["usb charging port"], ["touch control"], ["led"], ["bedside"], ["modern", "vintage"]],
        {"color": HOME_COLORS},
        (15, 90),
    ),
    _t(
        "earbuds",
        f"{_E} › Headphones, Earbuds & Accessories › Earbuds",
        "wireless earbuds",
        ["wireless earbuds", "bluetooth headphones"],
        "",
        [
            ["noise cancelling"],
            ["bluetooth 5.3", "bluetooth 5.0"],
            ["long battery life"],
            ["water resistant"],
            ["fast charging"],
            ["with microphone"],
        ],
        {"color": TECH_COLORS},
        (15, 180),
    ),
    _t(
        "phone_case",
        f"{_E} › Cell Phones & Accessories › Cases, Holsters & Sleeves › Basic Cases",
        "phone case",
        ["phone case", "protective case"],
        "",
        [["shockproof"], ["slim"], ["wireless charging compatible"], ["clear", "matte"], ["with kickstand"]],
        {
            "color": TECH_COLORS,
            "model": ["iphone 13", "iphone 14", "iphone 15", "galaxy s22", "galaxy s23", "pixel 7"],
        },
        (6, 40),
    ),
    _t(
        "power_bank",
        f"{_E} › Cell Phones & Accessories › Chargers & Power Adapters › Portable Power Banks",
        "portable charger",
        ["portable charger", "power bank"],
        "",
        [["fast charging"], ["usb c"], ["led display"], ["compact"], ["wireless charging"]],
        {"color": TECH_COLORS, "capacity": ["5000mah", "10000mah", "20000mah", "26800mah"]},
        (12, 80),
    ),
)

BRAND_SYLLABLES = (
    "nor", "va", "lin", "kor", "bel", "ta", "ri", "mon", "zen", "ora", "vel", "dra", "ka", "lu", "sen",
    "tor", "mi", "qua", "pex", "ly", "fen", "dor", "sa", "vik", "ne", "bri", "co", "ax", "ul", "ro",
)  # fmt: skip

_NOT_NOUNS = frozenset(
    {"and", "with", "extra", "virgin", "green", "ground", "whole", "portable", "wireless", "t", "liquid", "herbal",
     "midi", "maxi", "night", "blow", "gaming", "protective", "running", "side", "denim", "snack"}
)  # fmt: skip
NOUNS: frozenset[str] = frozenset(
    {w for t in TYPES for n in t.nouns for w in n.split() if w not in _NOT_NOUNS} | {"shoes", "set"}
)
