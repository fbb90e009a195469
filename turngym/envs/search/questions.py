"""Multi-hop questions over a synthetic ``World``: bridge (2-4 hops) and comparison.

A bridge question walks a chain of functional relations from a named entity
(``the country of the city where the founder of Quorvex Labs was born``); hop i's passage
states the relation whose object is the entity hop i+1 searches for, so each hop's gold query
(``<entity name> <keyword>``) is built from what the previous hop retrieved. A comparison
question names two entities of one type, needs a numeric fact about each, and asks for a fact
of the winner (or the difference), so the answer never appears among the options.

Every question is rejected unless its normalised answer is absent from its text.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from turngym.envs.search.metrics import contains_answer
from turngym.envs.search.tasks import QATask
from turngym.envs.search.world import ATTRIBUTES, RELATIONS, Entity, World

#: relation -> noun phrases for "the <relation> of {x}" (the first is the plain form)
PHRASES: dict[str, tuple[str, ...]] = {
    "born_in": ("the birthplace of {x}", "the city where {x} was born"),
    "employer": ("the employer of {x}", "the company that employs {x}"),
    "alma_mater": ("the alma mater of {x}", "the university that {x} attended"),
    "founder": ("the founder of {x}", "the person who founded {x}"),
    "headquarters": ("the headquarters city of {x}", "the city where {x} is based"),
    "location": ("the city that hosts {x}", "the home city of {x}"),
    "country": ("the country of {x}", "the country where {x} lies"),
    "mayor": ("the mayor of {x}",),
    "capital": ("the capital of {x}",),
    "author": ("the author of {x}", "the writer of {x}"),
    "publisher": ("the publisher of {x}",),
}

#: final fact -> question templates
ASKS: dict[str, tuple[str, ...]] = {
    "born_in": ("Where was {x} born?", "In which city was {x} born?"),
    "employer": ("Which company does {x} work for?", "Who employs {x}?"),
    "alma_mater": ("Which university did {x} attend?", "Where did {x} study?"),
    "founder": ("Who founded {x}?", "Who is the founder of {x}?"),
    "headquarters": ("Where is {x} headquartered?", "In which city is {x} based?"),
    "location": ("In which city is {x} located?",),
    "country": ("In which country is {x}?", "Which country is {x} part of?"),
    "mayor": ("Who is the mayor of {x}?",),
    "capital": ("What is the capital of {x}?",),
    "author": ("Who wrote {x}?", "Who is the author of {x}?"),
    "publisher": ("Which company published {x}?",),
    "birth_year": ("In what year was {x} born?",),
    "occupation": ("What is the occupation of {x}?", "What does {x} do for a living?"),
    "founded_year": ("In what year was {x} founded?",),
    "industry": ("In which industry does {x} operate?",),
    "population": ("What is the population of {x}?",),
    "currency": ("What is the currency of {x}?",),
    "year": ("In what year was {x} first published?",),
}


@dataclass(frozen=True)
class Comparison:
    kind: str
    attr: str
    pick: str  # "min", "max" or "diff"
    follow: str | None  # the winner's fact that is the answer (None for "diff")
    template: str


COMPARISONS: tuple[Comparison, ...] = (
    Comparison("person", "birth_year", "min", "born_in", "In which city was the older of {a} and {b} born?"),
    Comparison("person", "birth_year", "max", "alma_mater", "Which university did the younger of {a} and {b} attend?"),
    Comparison("person", "birth_year", "min", "occupation", "What is the occupation of the older of {a} and {b}?"),
    Comparison("person", "birth_year", "diff", None, "How many years apart were {a} and {b} born?"),
    Comparison("company", "founded_year", "min", "founder", "Who founded the older company, {a} or {b}?"),
    Comparison("company", "founded_year", "max", "headquarters", "Where is the younger of {a} and {b} headquartered?"),
    Comparison("book", "year", "min", "author", "Who wrote the earlier book, {a} or {b}?"),
    Comparison("book", "year", "diff", None, "How many years apart were {a} and {b} first published?"),
    Comparison("city", "population", "max", "country", "In which country is the more populous city, {a} or {b}?"),
    Comparison("city", "population", "min", "mayor", "Who is the mayor of the less populous city, {a} or {b}?"),
    Comparison("university", "founded_year", "min", "location", "In which city is the older university, {a} or {b}?"),
)  # fmt: skip

#: named mixes of question kinds: (kind, hops) -> weight ("comparison" ignores hops)
MIXES: dict[str, dict[tuple[str, int], float]] = {
    "default": {("bridge", 2): 0.25, ("bridge", 3): 0.25, ("bridge", 4): 0.2, ("comparison", 0): 0.3},
    "easy": {("bridge", 1): 0.5, ("bridge", 2): 0.35, ("comparison", 0): 0.15},
    "hard": {("bridge", 3): 0.3, ("bridge", 4): 0.4, ("comparison", 0): 0.3},
    # the sparse-outcome regime (issue 41): long bridge chains only, where a small policy rarely succeeds
    "sparse": {("bridge", 3): 0.3, ("bridge", 4): 0.4, ("bridge", 5): 0.3},
}
DEFAULT_MIX = MIXES["default"]

MAX_FAILED_DRAWS = 2_000


class QuestionError(RuntimeError):
    """The world cannot produce the requested kind of question."""


def generate_questions(
    world: World,
    n: int,
    *,
    seed: int = 0,
    mix: str | dict[tuple[str, int], float] = "default",
    id_prefix: str | None = None,
) -> list[QATask]:
    """``n`` distinct questions drawn with ``random.Random(seed)`` (the same inputs give the same list)."""
    rng = random.Random(f"questions:{world.config.key()}:{seed}")
    if isinstance(mix, str):
        if mix not in MIXES:
            raise ValueError(f"unknown question mix {mix!r}; choose one of {sorted(MIXES)} or pass a dict")
        mix = MIXES[mix]
    kinds, weights = list(mix), list(mix.values())
    for kind, hops in kinds:
        if kind not in ("bridge", "comparison") or (kind == "bridge" and not 1 <= hops <= 6):
            raise ValueError(f"unknown question kind {(kind, hops)!r}")
    prefix = id_prefix or f"synth-{world.config.key()[:8]}-{seed}"
    out: list[QATask] = []
    seen: set[str] = set()
    streak = 0  # failed draws since the last success
    while len(out) < n:
        kind, hops = rng.choices(kinds, weights)[0]
        task = _bridge(world, rng, hops) if kind == "bridge" else _comparison(world, rng)
        if task is None or task.question in seen:
            streak += 1
            if streak > MAX_FAILED_DRAWS:
                raise QuestionError(f"could only make {len(out)} of {n} distinct questions from this world")
            continue
        streak = 0
        seen.add(task.question)
        task.id = f"{prefix}-{len(out):06d}"
        out.append(task)
    return out


def _facts_of(kind: str) -> list[str]:
    return list(RELATIONS[kind]) + list(ATTRIBUTES[kind])


def _bridge(world: World, rng: random.Random, hops: int) -> QATask | None:
    ents = world.entities
    start = ents[rng.randrange(len(ents))]
    chain: list[tuple[Entity, str]] = []  # (subject, fact key)
    visited = {start.idx}
    cur = start
    for h in range(hops):
        last = h == hops - 1
        options = _facts_of(cur.kind) if last else list(RELATIONS[cur.kind])
        options = [k for k in options if k not in cur.rels or cur.rels[k] not in visited]
        if not options:
            return None
        key = rng.choice(options)
        chain.append((cur, key))
        if key in cur.rels:
            cur = ents[cur.rels[key]]
            visited.add(cur.idx)
    phrase = start.name
    for i, (_, key) in enumerate(chain[:-1]):
        variants = PHRASES[key]
        # nested relative clauses read badly: inside a phrase, prefer the plain "the R of X" form
        template = variants[0] if i > 0 and rng.random() < 0.7 else rng.choice(variants)
        phrase = template.format(x=phrase)
    last_subject, last_key = chain[-1]
    question = rng.choice(ASKS[last_key]).format(x=phrase)
    answer = world.value_text(last_subject, last_key)
    return _finish(world, question, [answer], chain, "bridge", {"start": start.name})


def _comparison(world: World, rng: random.Random) -> QATask | None:
    comp = rng.choice(COMPARISONS)
    pool = world.by_kind[comp.kind]
    a = world.entities[rng.choice(pool)]
    twin = [e for e in (a.twin_of,) if e is not None]
    if twin and rng.random() < 0.4:  # compare an entity with its near-duplicate
        b = world.entities[twin[0]]
    else:
        b = world.entities[rng.choice(pool)]
    va, vb = a.attrs[comp.attr], b.attrs[comp.attr]
    if a.idx == b.idx or va == vb:
        return None
    if rng.random() < 0.5:
        a, b, va, vb = b, a, vb, va
    chain = [(a, comp.attr), (b, comp.attr)]
    if comp.pick == "diff":
        d = abs(int(va) - int(vb))
        answers = [str(d), f"{d} years"]
    else:
        winner = a if (va < vb) == (comp.pick == "min") else b
        chain.append((winner, comp.follow))  # type: ignore[arg-type]
        answers = [world.value_text(winner, comp.follow)]  # type: ignore[arg-type]
    question = comp.template.format(a=a.name, b=b.name)
    return _finish(world, question, answers, chain, "comparison", {"attribute": comp.attr, "pick": comp.pick})


def _finish(
    world: World,
    question: str,
    answers: list[str],
    chain: Sequence[tuple[Entity, str]],
    kind: str,
    meta: dict[str, str],
) -> QATask | None:
    if contains_answer(question, answers):
        return None
    supporting: list[str] = []
    trace: list[str] = []
    for subject, key in chain:
        site = world.facts[(subject.idx, key)]
        if site.passage_id not in supporting:
            supporting.append(site.passage_id)
            trace.append(world.gold_query(subject, key))
    return QATask(
        id="",
        question=question,
        answers=answers,
        supporting_ids=supporting,
        gold_trace=trace,
        kind=kind,
        hops=len(supporting),
        metadata={
            **meta,
            "facts": [[s.name, k] for s, k in chain],
            "hop_answers": hop_answers(world, chain, answers),
        },
    )


def hop_answers(world: World, chain: Sequence[tuple[Entity, str]], answers: list[str]) -> list[str]:
    """What each hop of ``chain`` reveals, in order, ending with the gold answer: a bridge question's
    intermediate entities then its answer, a comparison's two compared values then its answer (the
    targets of IGPO's per-hop information gain, ``credit.igpo.gain_targets=hops``)."""
    out: list[str] = []
    for subject, key in chain:
        value = world.value_text(subject, key)
        if value not in out:
            out.append(value)
    if out[-1:] != answers[:1]:
        out = [v for v in out if v != answers[0]] + [answers[0]]
    return out
