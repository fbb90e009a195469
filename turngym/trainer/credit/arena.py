"""``arena``: tournament ranking inside a group (ArenaRL, arXiv 2601.06487).

A judge compares two trajectories ``(i, j) -> (score_i, score_j)``; a topology decides which pairs
meet, round by round (the matches of one round run concurrently); the final ranking becomes
advantages through :func:`rank_advantages`. Topologies are generators that yield a round's pairs
and receive its :class:`Match` results, so one driver serves them all.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from turngym.core.plugins import load_object
from turngym.trainer.credit.base import GroupCredit, broadcast
from turngym.trainer.credit.normalize import zscore
from turngym.trainer.credit.registry import CreditContext, MethodSettings, credit_method

Judge = Callable[[int, int], tuple[float, float]]
Topology = Literal["single_elimination", "round_robin", "anchor", "swiss", "double_elimination"]


@dataclass(frozen=True)
class Match:
    a: int
    b: int
    score_a: float
    score_b: float
    round: int


@dataclass
class TournamentResult:
    """``ranking[k]`` is the index of the trajectory at rank k (0 = best)."""

    ranking: list[int]
    matches: list[Match] = field(default_factory=list)

    @property
    def num_matches(self) -> int:
        return len(self.matches)


Schedule = Generator[list[tuple[int, int]], list[Match], list[int]]


# ---------------------------------------------------------------- helpers
def _winner(m: Match, rng: np.random.Generator) -> int:
    if m.score_a != m.score_b:
        return m.a if m.score_a > m.score_b else m.b
    return m.a if rng.random() < 0.5 else m.b


def _mean_scores(n: int, matches: Sequence[Match]) -> np.ndarray:
    total, count = np.zeros(n), np.zeros(n)
    for m in matches:
        total[m.a] += m.score_a
        total[m.b] += m.score_b
        count[m.a] += 1
        count[m.b] += 1
    return np.divide(total, count, out=np.zeros(n), where=count > 0)


def _order(keys: Sequence[Sequence[float]], rng: np.random.Generator) -> list[int]:
    """Indices sorted by descending keys (tuples), remaining ties broken at random."""
    tiebreak = rng.permutation(len(keys))
    return sorted(range(len(keys)), key=lambda p: (*(-k for k in keys[p]), tiebreak[p]))


def seeded_bracket(size: int) -> list[int]:
    """Standard seeded order of a bracket of ``size`` (a power of two), 1-based: 8 -> 1,8,4,5,2,7,3,6."""
    order = [1]
    while len(order) < size:
        m = 2 * len(order)
        order = [s for seed in order for s in (seed, m + 1 - seed)]
    return order


def _anchor_seeds(n: int, matches: Sequence[Match]) -> np.ndarray:
    """Score vs the anchor (trajectory 0); the anchor's own seed is the mean of its scores."""
    seed = np.zeros(n)
    for m in matches:
        seed[m.b] = m.score_b
    seed[0] = float(np.mean([m.score_a for m in matches])) if matches else 0.0
    return seed


# ------------------------------------------------------------- topologies
def _anchor(n: int, rng: np.random.Generator) -> Schedule:
    matches = (yield [(0, i) for i in range(1, n)]) if n > 1 else []
    return _order([(s,) for s in _anchor_seeds(n, matches)], rng)


def _round_robin(n: int, rng: np.random.Generator) -> Schedule:
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    matches = (yield pairs) if pairs else []
    wins = np.zeros(n)
    for m in matches:
        wins[_winner(m, rng)] += 1
    mean = _mean_scores(n, matches)
    return _order([(mean[p], wins[p]) for p in range(n)], rng)


def _single_elimination(n: int, rng: np.random.Generator) -> Schedule:
    if n <= 1:
        return list(range(n))
    played: list[Match] = list((yield [(0, i) for i in range(1, n)]))
    seeds = _anchor_seeds(n, played)
    by_seed = _order([(s,) for s in seeds], rng)
    size = 1 << (n - 1).bit_length()
    # seeds beyond n are byes; in the standard order they meet the top seeds
    slots: list[int | None] = [by_seed[s - 1] if s <= n else None for s in seeded_bracket(size)]
    out_round: dict[int, int] = {}
    rnd = 1
    while len(slots) > 1:
        pairs = [(slots[k], slots[k + 1]) for k in range(0, len(slots), 2)]
        real = [(a, b) for a, b in pairs if a is not None and b is not None]
        results = iter((yield real)) if real else iter(())
        nxt: list[int | None] = []
        for a, b in pairs:
            if a is None or b is None:
                nxt.append(a if b is None else b)
                continue
            m = next(results)
            played.append(m)
            w = _winner(m, rng)
            out_round[b if w == a else a] = rnd
            nxt.append(w)
        slots, rnd = nxt, rnd + 1
    champion = slots[0]
    mean = _mean_scores(n, played)
    seed_rank = {p: k for k, p in enumerate(by_seed)}
    rest = sorted(out_round, key=lambda p: (-out_round[p], -mean[p], seed_rank[p]))
    return [champion, *rest]


def _swiss(n: int, rng: np.random.Generator, rounds: int | None = None) -> Schedule:
    rounds = rounds if rounds is not None else max(math.ceil(math.log2(n)), 1) if n > 1 else 0
    points = np.zeros(n)
    met: set[tuple[int, int]] = set()
    had_bye: set[int] = set()
    played: list[Match] = []
    start = [int(p) for p in rng.permutation(n)]
    for r in range(rounds):
        if r == 0:
            standing = start
        else:
            mean = _mean_scores(n, played)
            standing = _order([(points[p], mean[p]) for p in range(n)], rng)
        if len(standing) % 2:  # the lowest-standing player without a bye sits out and scores a win
            bye = next((p for p in reversed(standing) if p not in had_bye), standing[-1])
            had_bye.add(bye)
            points[bye] += 1
            standing = [p for p in standing if p != bye]
        pairs, free = [], list(standing)
        while free:
            a = free.pop(0)
            k = next((k for k, b in enumerate(free) if (min(a, b), max(a, b)) not in met), 0)
            b = free.pop(k)
            met.add((min(a, b), max(a, b)))
            pairs.append((a, b))
        results = yield pairs
        for m in results:
            played.append(m)
            points[_winner(m, rng)] += 1
    mean = _mean_scores(n, played)
    return _order([(points[p], mean[p]) for p in range(n)], rng)


def _double_elimination(n: int, rng: np.random.Generator) -> Schedule:
    """Everyone is out after a second loss. Each round pairs players with equal losses in seed order
    (a random permutation); an odd player of the winners' side meets one of the losers' side,
    else gets a bye. The last two meet until one of them has two losses (grand final and reset)."""
    losses = np.zeros(n, dtype=int)
    seed = {int(p): k for k, p in enumerate(rng.permutation(n))}
    out_round: dict[int, int] = {}
    played: list[Match] = []
    rnd = 0
    while sum(losses < 2) > 1:
        rnd += 1
        sides = [sorted((p for p in range(n) if losses[p] == lv), key=seed.get) for lv in (0, 1)]
        pairs = []
        leftovers = []
        for side in sides:
            pairs += [(side[k], side[k + 1]) for k in range(0, len(side) - 1, 2)]
            if len(side) % 2:
                leftovers.append(side[-1])
        if len(leftovers) == 2:
            pairs.append((leftovers[0], leftovers[1]))
        results = yield pairs
        for m in results:
            played.append(m)
            w = _winner(m, rng)
            loser = m.b if w == m.a else m.a
            losses[loser] += 1
            if losses[loser] == 2:
                out_round[loser] = rnd
    champion = next(p for p in range(n) if losses[p] < 2) if n else None
    mean = _mean_scores(n, played)
    rest = sorted(out_round, key=lambda p: (-out_round[p], -mean[p], seed[p]))
    return ([champion] if champion is not None else []) + rest


TOPOLOGIES: dict[str, Callable[[int, np.random.Generator], Schedule]] = {
    "single_elimination": _single_elimination,
    "round_robin": _round_robin,
    "anchor": _anchor,
    "swiss": _swiss,
    "double_elimination": _double_elimination,
}


# ------------------------------------------------------------------ driver
def run_tournament(topology: str, n: int, judge: Judge, seed: int = 0, workers: int = 1) -> TournamentResult:
    """Play a tournament of ``n`` trajectories; the matches of a round run on ``workers`` threads."""
    if topology not in TOPOLOGIES:
        raise ValueError(f"unknown topology {topology!r}; choose from {sorted(TOPOLOGIES)}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if n == 0:
        return TournamentResult([])
    rng = np.random.default_rng(seed)
    schedule = TOPOLOGIES[topology](n, rng)
    matches: list[Match] = []
    rnd = 0
    pool = ThreadPoolExecutor(workers) if workers > 1 else None
    try:
        pairs = next(schedule)
        while True:
            mapper = pool.map if pool is not None else map
            scores = list(mapper(lambda p: judge(*p), pairs))
            results = [
                Match(a, b, float(sa), float(sb), rnd) for (a, b), (sa, sb) in zip(pairs, scores, strict=True)
            ]
            matches.extend(results)
            rnd += 1
            pairs = schedule.send(results)
    except StopIteration as stop:
        ranking = stop.value
    finally:
        if pool is not None:
            pool.shutdown()
    if sorted(ranking) != list(range(n)):
        raise AssertionError(f"{topology} produced an invalid ranking {ranking}")
    return TournamentResult(ranking, matches)


def single_elimination(n: int, judge: Judge, seed: int = 0, workers: int = 1) -> TournamentResult:
    """Anchor seeding (n-1 matches) then a seeded bracket with byes for the top seeds (n-1 matches)."""
    return run_tournament("single_elimination", n, judge, seed, workers)


def round_robin(n: int, judge: Judge, seed: int = 0, workers: int = 1) -> TournamentResult:
    """Every pair once (n(n-1)/2 matches); ranked by mean score, then wins."""
    return run_tournament("round_robin", n, judge, seed, workers)


def anchor(n: int, judge: Judge, seed: int = 0, workers: int = 1) -> TournamentResult:
    """Every trajectory plays trajectory 0 (n-1 matches); ranked by the score against it."""
    return run_tournament("anchor", n, judge, seed, workers)


def swiss(n: int, judge: Judge, seed: int = 0, workers: int = 1) -> TournamentResult:
    """ceil(log2 n) rounds pairing equal standings without rematches; ranked by points, then mean score."""
    return run_tournament("swiss", n, judge, seed, workers)


def double_elimination(n: int, judge: Judge, seed: int = 0, workers: int = 1) -> TournamentResult:
    """Out after two losses (about 2n-2 matches); ranked by elimination round, then mean score."""
    return run_tournament("double_elimination", n, judge, seed, workers)


def rank_advantages(ranking: Sequence[int]) -> list[float]:
    """Rank k (0 = best) -> ``1 - k/(N-1)`` -> z-score in the group; returned indexed by trajectory."""
    n = len(ranking)
    if n <= 1:
        return [0.0] * n
    reward = [0.0] * n
    for k, p in enumerate(ranking):
        reward[p] = 1.0 - k / (n - 1)
    return zscore(reward)


@dataclass
class Arena:
    """Tournament ranking with a pairwise trajectory judge ``judge(traj_a, traj_b) -> (sa, sb)``."""

    judge: Callable
    topology: Topology = "single_elimination"
    seed: int = 0
    workers: int = 8
    name: str = "arena"

    def begin_step(self, step: int, seed: int) -> None:
        """Tie-breaks of this step's tournaments come from the step's seed (same seed, same result)."""
        self.seed = seed

    def metrics(self) -> dict[str, float]:
        """The judge's counters (``judge/matches``, ``judge/ties``, ...), if it keeps any."""
        return dict(getattr(self.judge, "metrics", None) or {})

    def group_advantages(self, group) -> GroupCredit:
        result = run_tournament(
            self.topology, len(group), lambda i, j: self.judge(group[i], group[j]), self.seed, self.workers
        )
        self.seed += 1  # a fresh tie-break stream for the next group, reproducible from the first seed
        adv = rank_advantages(result.ranking)
        return GroupCredit(
            broadcast(adv, [t.turns for t in group]), {"arena/matches": float(result.num_matches)}
        )


class ArenaSettings(MethodSettings):
    """``credit.arena``."""

    topology: Topology = "single_elimination"
    judge: Literal["programmatic", "llm"] = "programmatic"
    # programmatic: "module:function" of (traj_a, traj_b) -> (score_a, score_b); default: the env's
    # published programmatic judge, else the outcome reward
    judge_fn: str | None = None
    # llm judge through an OpenAI-compatible endpoint
    judge_base_url: str | None = None
    judge_model: str | None = None
    # "research", or an env id/family that publishes a judge ("travel"); default: the env's, else research
    rubric: str | None = None
    retries: int = 2
    workers: int = 8


def build_judge(settings: ArenaSettings, env: str | None = None) -> Callable:
    """The judge ``credit.arena`` describes: an LLM judge, ``judge_fn``, or a programmatic default.

    ``env``: the env being trained. The judge and rubric come from the settings first, then from
    what the env publishes (:func:`turngym.core.judging.env_judge`): an LLM judge without a
    ``rubric`` uses the env's rubric and prompt (else ``research``); a programmatic judge without a
    ``judge_fn`` uses the env's programmatic scorer (else the outcome comparison).
    """

    from turngym.core.judging import env_judge
    from turngym.trainer.judges import LLMJudge, ProgrammaticJudge, openai_complete, outcome_judge

    a = settings
    published = env_judge(env) if env else None
    if a.judge == "llm":
        if not (a.judge_base_url and a.judge_model):
            raise ValueError("credit.arena.judge=llm needs judge_base_url and judge_model")
        rubric = a.rubric or published or "research"
        return LLMJudge(openai_complete(a.judge_base_url, a.judge_model, temperature=0.0), rubric, a.retries)
    if a.judge_fn:
        return ProgrammaticJudge(load_object(a.judge_fn, "credit.arena.judge_fn", must_call=True))
    if published is not None and published.pairwise is not None:
        return ProgrammaticJudge(published.pairwise)
    return outcome_judge()


@credit_method("arena", settings=ArenaSettings)
def build(settings: ArenaSettings, ctx: CreditContext) -> Arena:
    """A judge passed to the trainer wins over the one the settings describe."""
    judge = ctx.judge or build_judge(settings, ctx.env)
    return Arena(judge, settings.topology, ctx.seed, settings.workers)
