"""A seeded synthetic world: typed entities, typed relations, and passages written about them.

Six entity types (country, city, person, company, university, book) are linked by functional
relations (a person is born in one city, a company has one founder, ...) and carry attributes
(years, populations, occupations). Every fact is written into a passage about its subject from
one of several templates; each template carries the keyword that a searcher would pair with the
subject's name to find that sentence (``"Halvor Brenn born"``). The corpus also holds

* near-duplicate entities (``Halvor Brenn`` / ``Halvor Brenna``) with independent facts,
* people sharing first or last names,
* list passages ("Notable people born in Porvik ...") that repeat true facts in other words, and
* event passages that mention several entities and state no relation at all,

so a question can only be answered by retrieving the right passage of the right entity.
Everything is drawn from ``random.Random(seed)``: the same config gives the same world.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

from turngym.envs.search.corpus import Corpus

GENERATOR_VERSION = 3  # covers the question generator too (the dataset cache uses this key)

KINDS = ("country", "city", "person", "company", "university", "book")

#: subject kind -> relation -> object kind (every relation is functional: one object per subject)
RELATIONS: dict[str, dict[str, str]] = {
    "person": {"born_in": "city", "employer": "company", "alma_mater": "university"},
    "company": {"founder": "person", "headquarters": "city"},
    "university": {"location": "city"},
    "city": {"country": "country", "mayor": "person"},
    "country": {"capital": "city"},
    "book": {"author": "person", "publisher": "company"},
}

#: subject kind -> attributes; numeric ones can be compared
ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "person": ("birth_year", "occupation"),
    "company": ("founded_year", "industry"),
    "university": ("founded_year",),
    "city": ("population", "founded_year"),
    "country": ("currency",),
    "book": ("year",),
}
_FACT_KEYS = {k: (*RELATIONS[k], *ATTRIBUTES[k]) for k in RELATIONS}
NUMERIC = frozenset({"birth_year", "founded_year", "population", "year"})

#: (kind, fact) -> [(sentence template, search keyword)]; {s} subject, {o} object, {v} value
TEMPLATES: dict[tuple[str, str], list[tuple[str, str]]] = {
    ("person", "born_in"): [
        ("{s} was born in {o}.", "born"),
        ("{s} is a native of {o}.", "native"),
        ("The birthplace of {s} is {o}.", "birthplace"),
        ("{o} is the hometown of {s}.", "hometown"),
    ],
    ("person", "birth_year"): [
        ("{s} was born in the year {v}.", "born year"),
        ("The birth year of {s} is {v}.", "birth year"),
        ("{s} entered the world in {v}.", "entered world"),
    ],
    ("person", "occupation"): [
        ("{s} works as {a} {v}.", "works as"),
        ("By profession, {s} is {a} {v}.", "profession"),
        ("{s} trained and worked as {a} {v}.", "trained"),
    ],
    ("person", "employer"): [
        ("{s} is employed by {o}.", "employed"),
        ("{s} joined the staff of {o}.", "joined staff"),
        ("{o} employs {s}.", "employs"),
    ],
    ("person", "alma_mater"): [
        ("{s} studied at {o}.", "studied"),
        ("{s} graduated from {o}.", "graduated"),
        ("{s} is an alumnus of {o}.", "alumnus"),
    ],
    ("company", "founder"): [
        ("{s} was founded by {o}.", "founded by"),
        ("{o} started {s}.", "started"),
        ("{s} was established by the entrepreneur {o}.", "established entrepreneur"),
    ],
    ("company", "headquarters"): [
        ("{s} is headquartered in {o}.", "headquartered"),
        ("The head office of {s} is in {o}.", "head office"),
        ("{s} is based in {o}.", "based"),
    ],
    ("company", "founded_year"): [
        ("{s} has been in business since {v}.", "business since"),
        ("{s} opened for business in {v}.", "opened business"),
        ("The company {s} dates from {v}.", "dates"),
    ],
    ("company", "industry"): [
        ("{s} is {a} {v} company.", "company"),
        ("{s} operates in the {v} sector.", "sector"),
        ("The main business of {s} is {v}.", "main business"),
    ],
    ("university", "location"): [
        ("{s} has its campus in {o}.", "campus"),
        ("{s} is located in {o}.", "located"),
        ("The university {s} sits in {o}.", "university sits"),
    ],
    ("university", "founded_year"): [
        ("{s} was chartered in {v}.", "chartered"),
        ("{s} admitted its first students in {v}.", "first students"),
        ("The university {s} was established in {v}.", "university established"),
    ],
    ("city", "country"): [
        ("{s} is a city in {o}.", "city in"),
        ("{s} lies within the borders of {o}.", "borders"),
        ("{s} belongs to the country of {o}.", "belongs country"),
    ],
    ("city", "mayor"): [
        ("The mayor of {s} is {o}.", "mayor"),
        ("{o} serves as mayor of {s}.", "serves mayor"),
        ("{s} is governed by mayor {o}.", "governed mayor"),
    ],
    ("city", "population"): [
        ("{s} has a population of {v}.", "population"),
        ("About {v} residents live in {s}.", "residents"),
        ("The census counted {v} inhabitants in {s}.", "census inhabitants"),
    ],
    ("city", "founded_year"): [
        ("{s} was settled in {v}.", "settled"),
        ("The town of {s} was founded in {v}.", "town founded"),
        ("Records show that {s} was first built in {v}.", "first built"),
    ],
    ("country", "capital"): [
        ("The capital of {s} is {o}.", "capital"),
        ("{o} is the capital city of {s}.", "capital city"),
        ("{s} is governed from its capital, {o}.", "governed capital"),
    ],
    ("country", "currency"): [
        ("The currency of {s} is the {v}.", "currency"),
        ("{s} pays in a currency called the {v}.", "currency called"),
        ("Shops in {s} take the {v}.", "shops take"),
    ],
    ("book", "author"): [
        ("{s} is a novel by {o}.", "novel by"),
        ("{s} was written by {o}.", "written"),
        ("{o} is the author of {s}.", "author"),
    ],
    ("book", "publisher"): [
        ("{s} was published by {o}.", "published by"),
        ("{o} is the publisher of {s}.", "publisher"),
        ("{s} appeared under the imprint of {o}.", "imprint"),
    ],
    ("book", "year"): [
        ("{s} was first printed in {v}.", "first printed"),
        ("{s} came out in {v}.", "came out"),
        ("The first edition of {s} is dated {v}.", "first edition"),
    ],
}

FILLERS: dict[str, tuple[str, ...]] = {
    "person": (
        "Colleagues describe {s} as meticulous and patient.",
        "{s} rarely gives interviews.",
        "{s} keeps a large private library.",
    ),
    "company": (
        "{s} employs staff across several offices.",
        "{s} has been the subject of several business case studies.",
    ),
    "university": ("{s} offers degrees in the sciences and humanities.", "{s} runs a small observatory."),
    "city": ("{s} is known for its old market square.", "Visitors come to {s} for its riverside walks."),
    "country": ("{s} has a varied landscape of hills and plains.", "{s} holds elections every four years."),
    "book": ("{s} received mixed reviews.", "{s} has been translated into several languages."),
}

OCCUPATIONS = (
    "architect", "chemist", "painter", "surgeon", "journalist", "composer", "engineer", "geologist",
    "historian", "pilot", "sculptor", "economist", "botanist", "lawyer", "photographer", "astronomer",
    "librarian", "cartographer", "violinist", "mathematician", "diplomat", "novelist", "pharmacist",
    "veterinarian", "linguist", "chef", "carpenter", "physicist", "biologist", "translator",
)  # fmt: skip
INDUSTRIES = (
    "shipping", "software", "textile", "mining", "brewing", "insurance", "aviation", "publishing",
    "pharmaceutical", "robotics", "furniture", "telecom", "agriculture", "steel", "tourism", "banking",
)  # fmt: skip
COMPANY_SUFFIXES = ("Systems", "Holdings", "Industries", "Labs", "Group", "Works", "Dynamics", "Partners")
UNIVERSITY_FORMS = ("{w} University", "University of {w}", "{w} Institute of Technology", "{w} College")
BOOK_ADJ = (
    "Silent", "Broken", "Golden", "Hidden", "Last", "Crimson", "Distant", "Frozen", "Lost", "Quiet",
    "Burning", "Hollow", "Bitter", "Secret", "Wandering", "Pale", "Iron", "Scarlet", "Endless", "Twin",
)  # fmt: skip
BOOK_NOUN = (
    "Harbor", "Garden", "Lantern", "River", "Orchard", "Tower", "Voyage", "Kingdom", "Letter", "Winter",
    "Compass", "Mirror", "Archive", "Bridge", "Meadow", "Forge", "Signal", "Island", "Station", "Crown",
)  # fmt: skip
EVENT_NOUNS = ("Summit", "Accord", "Exhibition", "Festival", "Symposium", "Conference", "Expedition", "Fair")

_ONSETS = (
    "b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z",
    "br", "dr", "gr", "kr", "tr", "st", "th", "sh",
)  # fmt: skip
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ae", "ei", "ou")
_CODAS = ("", "", "", "", "", "n", "r", "l", "s", "k", "m", "nd", "rn")
_SHARES = (("person", 0.42), ("company", 0.14), ("city", 0.14), ("university", 0.05), ("book", 0.22))


@dataclass(frozen=True)
class WorldConfig:
    """What decides a world. ``n_passages`` is exact for ``n_passages >= 100``."""

    seed: int = 0
    n_passages: int = 10_000
    twin_rate: float = 0.1  # chance that a new entity is a near-duplicate of one before it
    split_rate: float = 0.3  # chance that an entity's passage is split in two
    entity_share: float = 0.6  # share of the passages about entities (the rest: lists and events)

    def __post_init__(self) -> None:
        if self.n_passages < 100:
            raise ValueError(f"n_passages must be >= 100, got {self.n_passages}")
        if not 0 <= self.twin_rate < 1 or not 0 <= self.split_rate <= 1:
            raise ValueError("twin_rate must be in [0, 1) and split_rate in [0, 1]")
        if not 0.1 <= self.entity_share <= 0.7:
            raise ValueError("entity_share must be in [0.1, 0.7]")

    def key(self) -> str:
        """Cache key: the config and the generator's version (bump it whenever the output changes)."""
        payload = json.dumps({**asdict(self), "generator": GENERATOR_VERSION}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


@dataclass(slots=True)
class Entity:
    idx: int
    kind: str
    name: str
    rels: dict[str, int] = field(default_factory=dict)
    attrs: dict[str, int | str] = field(default_factory=dict)
    twin_of: int | None = None


class FactSite(NamedTuple):
    """Where a fact is written: the passage id and the keyword of the template used."""

    passage_id: str
    keyword: str


class World:
    """Entities, the corpus written about them, and where each fact lives."""

    def __init__(
        self,
        config: WorldConfig,
        entities: list[Entity],
        corpus: Corpus,
        facts: dict[tuple[int, str], FactSite],
    ):
        self.config = config
        self.entities = entities
        self.corpus = corpus
        self.facts = facts
        self.by_kind: dict[str, list[int]] = {k: [] for k in KINDS}
        for e in entities:
            self.by_kind[e.kind].append(e.idx)

    def value_text(self, entity: Entity, key: str) -> str:
        """The fact ``key`` of ``entity`` as written in the corpus (an entity name or a value)."""
        if key in entity.rels:
            return self.entities[entity.rels[key]].name
        return render_value(key, entity.attrs[key])

    def gold_query(self, entity: Entity, key: str) -> str:
        """The search query that finds the passage stating ``key`` of ``entity``."""
        return f"{entity.name} {self.facts[(entity.idx, key)].keyword}"

    @classmethod
    def generate(cls, config: WorldConfig | None = None) -> World:
        return _Generator(config or WorldConfig()).run()


def render_value(key: str, value: int | str) -> str:
    if key == "population":
        return f"{int(value):,}"
    return str(value)


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


class _Generator:
    def __init__(self, config: WorldConfig):
        self.cfg = config
        self.rng = random.Random(config.seed)
        self.used: set[str] = set()
        self.entities: list[Entity] = []
        self.ids: list[str] = []
        self.titles: list[str] = []
        self.contents: list[str] = []
        self.facts: dict[tuple[int, str], FactSite] = {}
        self._random = self.rng.random

    # fast draws from the one seeded stream (random.Random.choice/randint cost ~1 us each)
    def _pick(self, seq):
        return seq[int(self._random() * len(seq))]

    def _int(self, lo: int, hi: int) -> int:
        return lo + int(self._random() * (hi - lo + 1))

    def _shuffle(self, items: list) -> None:
        for i in range(len(items) - 1, 0, -1):
            j = int(self._random() * (i + 1))
            items[i], items[j] = items[j], items[i]

    # ----------------------------------------------------------- names
    def _word(self, min_syl: int = 2, max_syl: int = 3) -> str:
        while True:
            n = self._int(min_syl, max_syl)
            w = "".join(self._pick(_ONSETS) + self._pick(_VOWELS) + self._pick(_CODAS) for _ in range(n))
            if self._random() < 0.2:  # some names start with a vowel
                w = w[1:] if w[1] in "aeiou" else w
            if 4 <= len(w) <= 10 and w not in self.used:
                self.used.add(w)
                return w.capitalize()

    def _mutate(self, word: str) -> str:
        """A near-duplicate of ``word``: one letter added, doubled or changed."""
        rng = self.rng
        for _ in range(20):
            op = self._int(0, 2)
            if op == 0:
                w = word + self._pick("aeiosn")
            elif op == 1:
                i = rng.randrange(1, len(word))
                w = word[:i] + word[i] + word[i:]
            else:
                i = rng.randrange(1, len(word))
                w = word[:i] + self._pick("aeiou" if word[i] in "aeiou" else "nrlstk") + word[i + 1 :]
            if w.lower() not in self.used:
                self.used.add(w.lower())
                return w
        return self._word()

    def _name(self, kind: str, pools: dict[str, list[str]], twin: Entity | None) -> str:
        rng = self.rng
        for _ in range(100):
            if kind == "person":
                first = self._pick(pools["first"])
                last = self._pick(pools["last"])
                if twin is not None:
                    first, last = twin.name.split(" ", 1)
                    last = self._mutate(last) if rng.random() < 0.7 else self._pick(pools["last"])
                name = f"{first} {last}"
            elif kind == "company":
                stem = self._mutate(twin.name.split(" ")[0]) if twin else self._word()
                name = f"{stem} {self._pick(COMPANY_SUFFIXES)}"
            elif kind == "university":
                stem = self._word()
                name = self._pick(UNIVERSITY_FORMS).format(w=stem)
            elif kind == "book":
                name = f"The {self._pick(BOOK_ADJ)} {self._pick(BOOK_NOUN)} of {self._word(2, 2)}"
            else:  # city, country: one word, reserved by _word/_mutate
                return self._mutate(twin.name) if twin else self._word()
            if name.lower() not in self.used:
                self.used.add(name.lower())
                return name
        raise RuntimeError(f"could not find a fresh {kind} name")  # pragma: no cover

    # -------------------------------------------------------- entities
    def _counts(self) -> dict[str, int]:
        budget = self.cfg.n_passages * self.cfg.entity_share / (1 + self.cfg.split_rate * 0.9)
        counts = {kind: max(4, int(budget * share)) for kind, share in _SHARES}
        counts["country"] = max(2, int(budget * 0.03))
        counts["city"] = max(counts["city"], counts["country"])
        return counts

    def _make_entities(self) -> None:
        rng = self.rng
        counts = self._counts()
        n_people = counts["person"]
        pools = {
            "first": [self._word(2, 2) for _ in range(max(20, n_people // 25))],
            "last": [self._word(2, 3) for _ in range(max(40, n_people // 3))],
        }
        for kind in KINDS:
            start = len(self.entities)
            for _ in range(counts[kind]):
                twin = None
                if len(self.entities) > start and kind != "book" and rng.random() < self.cfg.twin_rate:
                    twin = self.entities[self._int(start, len(self.entities) - 1)]
                e = Entity(len(self.entities), kind, self._name(kind, pools, twin))
                e.twin_of = twin.idx if twin else None
                self.entities.append(e)

    def _link(self) -> None:
        by_kind: dict[str, list[int]] = {k: [] for k in KINDS}
        for e in self.entities:
            by_kind[e.kind].append(e.idx)
        countries, cities = by_kind["country"], by_kind["city"]
        cities_of: dict[int, list[int]] = {c: [] for c in countries}
        for n, c in enumerate(cities):  # every country gets at least one city
            country = countries[n] if n < len(countries) else self._pick(countries)
            self.entities[c].rels["country"] = country
            cities_of[country].append(c)
        for c in countries:
            self.entities[c].rels["capital"] = self._pick(cities_of[c])
        for e in self.entities:
            for rel, obj_kind in RELATIONS[e.kind].items():
                if rel not in e.rels:
                    pool = by_kind[obj_kind]
                    obj = self._pick(pool)
                    while obj == e.idx:
                        obj = self._pick(pool)
                    e.rels[rel] = obj
            self._set_attrs(e)

    def _set_attrs(self, e: Entity) -> None:
        a = e.attrs
        if e.kind == "person":
            a["birth_year"] = self._int(1900, 2005)
            a["occupation"] = self._pick(OCCUPATIONS)
        elif e.kind == "company":
            a["founded_year"] = self._int(1850, 2020)
            a["industry"] = self._pick(INDUSTRIES)
        elif e.kind == "university":
            a["founded_year"] = self._int(1450, 1990)
        elif e.kind == "city":
            a["population"] = self._int(50, 30_000) * 100
            a["founded_year"] = self._int(800, 1900)
        elif e.kind == "country":
            a["currency"] = self._word(2, 2).lower()
        else:
            a["year"] = self._int(1900, 2023)

    # -------------------------------------------------------- passages
    def _add_passage(self, title: str, text: str) -> str:
        pid = str(len(self.ids))
        self.ids.append(pid)
        self.titles.append(title)
        self.contents.append(text)
        return pid

    def _write_entity(self, e: Entity) -> None:
        sentences: list[tuple[str | None, str, str]] = []  # (fact key or None, sentence, keyword)
        for key in _FACT_KEYS[e.kind]:
            template, keyword = self._pick(TEMPLATES[(e.kind, key)])
            if key in e.rels:
                text = template.format(s=e.name, o=self.entities[e.rels[key]].name)
            else:
                v = render_value(key, e.attrs[key])
                text = template.format(s=e.name, v=v, a=_article(v))
            sentences.append((key, text, keyword))
        if self._random() < 0.7:
            sentences.append((None, self._pick(FILLERS[e.kind]).format(s=e.name), ""))
        self._shuffle(sentences)
        chunks = [sentences]
        if len(sentences) >= 3 and self._random() < self.cfg.split_rate:
            cut = self._int(1, len(sentences) - 1)
            chunks = [sentences[:cut], sentences[cut:]]
        for chunk in chunks:
            pid = self._add_passage(e.name, " ".join(s for _, s, _ in chunk))
            for key, _, keyword in chunk:
                if key is not None:
                    self.facts[(e.idx, key)] = FactSite(pid, keyword)

    def _write_lists(self, budget: int) -> None:
        """Passages that restate true facts from the object's side (they are distractors too)."""
        rng = self.rng
        inverse: dict[tuple[str, int], list[int]] = {}
        for e in self.entities:
            for rel, obj in e.rels.items():
                inverse.setdefault((rel, obj), []).append(e.idx)
        heads = {
            "born_in": "Notable people born in {o} include {xs}.",
            "alma_mater": "Alumni of {o} include {xs}.",
            "author": "Works by {o} include {xs}.",
            "headquarters": "Companies based in {o} include {xs}.",
            "employer": "Staff of {o} include {xs}.",
        }
        keys = [k for k in inverse if k[0] in heads and len(inverse[k]) >= 2]
        rng.shuffle(keys)
        for rel, obj in keys[:budget]:
            subjects = inverse[(rel, obj)][:6]
            names = [self.entities[s].name for s in subjects]
            xs = ", ".join(names[:-1]) + " and " + names[-1]
            o = self.entities[obj].name
            self._add_passage(f"List: {o}", heads[rel].format(o=o, xs=xs))

    def _write_events(self, n: int) -> None:
        people = [e for e in self.entities if e.kind == "person"]
        cities = [e for e in self.entities if e.kind == "city"]
        orgs = [e for e in self.entities if e.kind in ("company", "university")]
        for _ in range(n):
            year = self._int(1950, 2024)
            city = self._pick(cities).name
            title = f"{year} {city} {self._pick(EVENT_NOUNS)}"
            p1, p2 = self._pick(people).name, self._pick(people).name
            org = self._pick(orgs).name
            form = self._int(0, 2)
            if form == 0:
                text = f"The {title} brought together {p1}, {p2} and delegates from {org}."
            elif form == 1:
                text = f"At the {title}, {p1} gave a talk and {p2} chaired a panel sponsored by {org}."
            else:
                text = f"Reports on the {title} quote {p1} and mention a stand run by {org}; {p2} attended."
            self._add_passage(title, text)

    def run(self) -> World:
        self._make_entities()
        self._link()
        for e in self.entities:
            self._write_entity(e)
        remaining = self.cfg.n_passages - len(self.ids)
        self._write_lists(max(0, remaining // 4))
        self._write_events(max(0, self.cfg.n_passages - len(self.ids)))
        corpus = Corpus(self.ids, self.titles, self.contents)
        return World(self.cfg, self.entities, corpus, self.facts)
