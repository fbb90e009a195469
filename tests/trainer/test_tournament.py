"""Tournament topologies: hand-traced brackets, match counts, and rankings under a perfect judge."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turngym.trainer.credit import rank_advantages, run_tournament, single_elimination
from turngym.trainer.credit.arena import TOPOLOGIES, seeded_bracket


def quality_judge(q):
    return lambda i, j: (q[i], q[j])


def test_seeded_bracket_order():
    assert seeded_bracket(8) == [1, 8, 4, 5, 2, 7, 3, 6]
    assert seeded_bracket(4) == [1, 4, 2, 3]
    assert seeded_bracket(1) == [1]


def test_single_elimination_with_byes_hand_traced():
    # seeding vs anchor 0: seeds 1:0.9 3:0.7 0:0.5 (mean of its scores) 4:0.3 2:0.1
    # bracket of 8: seeds 1,2,3 get byes; round 1: seed 4 (traj 4) beats seed 5 (traj 2)
    # round 2: 1 beats 4, 3 beats 0; final: 1 beats 3
    q = [0.5, 0.9, 0.1, 0.7, 0.3]
    res = single_elimination(5, quality_judge(q), seed=0)
    assert res.ranking == [1, 3, 0, 4, 2]
    assert res.num_matches == 2 * 5 - 2
    by_round = {}
    for m in res.matches:
        by_round.setdefault(m.round, []).append((m.a, m.b))
    assert by_round[0] == [(0, 1), (0, 2), (0, 3), (0, 4)]
    assert by_round[1] == [(4, 2)]
    assert by_round[2] == [(1, 4), (3, 0)]
    assert by_round[3] == [(1, 3)]


@pytest.mark.parametrize("n", [2, 3, 5, 6, 7, 8, 9, 16])
def test_match_counts(n):
    judge = quality_judge(list(np.linspace(0, 1, n)))
    assert run_tournament("single_elimination", n, judge).num_matches == 2 * n - 2
    assert run_tournament("round_robin", n, judge).num_matches == n * (n - 1) // 2
    assert run_tournament("anchor", n, judge).num_matches == n - 1
    assert run_tournament("double_elimination", n, judge).num_matches in (2 * n - 2, 2 * n - 1)
    assert run_tournament("swiss", n, judge).num_matches <= int(np.ceil(np.log2(n))) * (n // 2)


@pytest.mark.parametrize("topology", sorted(TOPOLOGIES))
def test_perfect_judge_finds_the_champion(topology):
    rng = np.random.default_rng(1)
    for n in (2, 5, 8, 11):
        q = list(rng.permutation(n) / n)
        res = run_tournament(topology, n, quality_judge(q), seed=3)
        assert sorted(res.ranking) == list(range(n))
        if topology != "anchor":  # the anchor's own seed is the mean of its scores, not its quality
            assert res.ranking[0] == int(np.argmax(q)), topology


def test_round_robin_is_exact_under_a_perfect_judge():
    q = [0.3, 0.9, 0.1, 0.5, 0.7, 0.2]
    assert run_tournament("round_robin", 6, quality_judge(q)).ranking == list(np.argsort(q)[::-1])


def test_ties_are_broken_reproducibly_with_the_seed():
    judge = lambda i, j: (0.5, 0.5)  # noqa: E731
    a = [run_tournament("single_elimination", 8, judge, seed=7).ranking for _ in range(2)]
    assert a[0] == a[1]
    many = {tuple(run_tournament("single_elimination", 8, judge, seed=s).ranking) for s in range(10)}
    assert len(many) > 1


def test_rounds_run_concurrently_with_the_same_result():
    q = list(np.linspace(0, 1, 8))
    serial = run_tournament("swiss", 8, quality_judge(q), seed=1)
    threaded = run_tournament("swiss", 8, quality_judge(q), seed=1, workers=4)
    assert serial.ranking == threaded.ranking and serial.matches == threaded.matches


def test_unknown_topology():
    with pytest.raises(ValueError, match="unknown topology"):
        run_tournament("ladder", 4, quality_judge([0] * 4))


@settings(max_examples=40)
@given(st.sampled_from(sorted(TOPOLOGIES)), st.integers(0, 12), st.integers(0, 1000))
def test_any_size_any_judge_gives_a_permutation(topology, n, seed):
    rng = np.random.default_rng(seed)
    judge = lambda i, j: tuple(rng.integers(0, 3, 2).astype(float))  # noqa: E731 - ties are frequent
    res = run_tournament(topology, n, judge, seed=seed)
    assert sorted(res.ranking) == list(range(n))
    assert all(m.a != m.b for m in res.matches)


def test_rank_advantages():
    assert rank_advantages([]) == []
    assert rank_advantages([0]) == [0.0]
    adv = rank_advantages([2, 0, 1])  # traj 2 best, traj 1 worst
    assert adv[2] > adv[0] > adv[1]
    assert sum(adv) == pytest.approx(0.0, abs=1e-9)
    # rewards 1, 0.5, 0 -> z-scores ±1.2247, 0
    assert adv == pytest.approx([0.0, -1.2247, 1.2247], abs=1e-4)
    for perm in itertools.permutations(range(4)):
        a = rank_advantages(list(perm))
        assert [a[p] for p in perm] == sorted(a, reverse=True)
