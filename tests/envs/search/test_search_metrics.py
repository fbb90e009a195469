"""SQuAD normalisation, EM and F1: examples from the official script and hypothesis properties."""

from __future__ import annotations

import string

from hypothesis import given
from hypothesis import strategies as st

from turngym.envs.search.metrics import (
    best_exact_match,
    best_f1,
    contains_answer,
    exact_match,
    f1_score,
    normalize_answer,
)

text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=60)
words = st.lists(
    st.sampled_from(["paris", "the", "a", "an", "city", "of", "light", "1998", "new", "york"]), max_size=8
)


def test_normalize_examples():
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert normalize_answer("An apple, a day") == "apple day"
    assert normalize_answer("  U.S.A.  ") == "usa"
    assert normalize_answer("Theatre") == "theatre"  # articles only as whole words
    assert normalize_answer("412,300") == normalize_answer("412300")


def test_exact_match_and_f1_examples():
    assert exact_match("the Beatles", "Beatles") == 1.0
    assert exact_match("Beatles band", "Beatles") == 0.0
    assert f1_score("Beatles band", "Beatles") == 2 * (0.5 * 1.0) / 1.5
    assert f1_score("", "") == 1.0
    assert f1_score("x", "") == 0.0
    assert f1_score("new york city", "york new") == 0.8


def test_best_over_alternatives():
    golds = ["17", "17 years"]
    assert best_exact_match("17 years.", golds) == 1.0
    assert best_f1("about 17", golds) == max(f1_score("about 17", g) for g in golds)
    assert best_exact_match("x", []) == 0.0 and best_f1("x", []) == 0.0


def test_contains_answer_matches_whole_tokens():
    assert contains_answer("Where was Porvik Brenn born?", ["porvik"])
    assert not contains_answer("Where was Porvika born?", ["Porvik"])
    assert not contains_answer("anything", [""])


@given(text)
def test_normalize_idempotent_and_clean(s):
    n = normalize_answer(s)
    assert normalize_answer(n) == n
    assert not any(ch in string.punctuation for ch in n)
    assert n == n.strip() and "  " not in n
    assert not {"a", "an", "the"} & set(n.split())


@given(text, text)
def test_f1_bounds_and_symmetry(a, b):
    f = f1_score(a, b)
    assert 0.0 <= f <= 1.0
    assert abs(f - f1_score(b, a)) < 1e-12
    if exact_match(a, b):
        assert f == 1.0


@given(words, st.randoms())
def test_f1_is_one_for_permutations_and_em_needs_order(ws, rnd):
    shuffled = list(ws)
    rnd.shuffle(shuffled)
    a, b = " ".join(ws), " ".join(shuffled)
    assert f1_score(a, b) == 1.0 or not normalize_answer(a)
    assert exact_match(a, b) == float(normalize_answer(a) == normalize_answer(b))


@given(text, st.sampled_from(["The ", "a ", "  ", "!", "", "AN "]), st.sampled_from(["", ".", " ?", "!!"]))
def test_case_articles_punctuation_do_not_matter(s, prefix, suffix):
    assert exact_match(prefix + s.upper() + suffix, s.lower()) == 1.0 or s.upper().lower() != s.lower()


@given(text, st.lists(text, min_size=1, max_size=4))
def test_best_is_max_over_golds(pred, golds):
    assert best_exact_match(pred, golds) == max(exact_match(pred, g) for g in golds)
    assert best_f1(pred, golds) == max(f1_score(pred, g) for g in golds)
