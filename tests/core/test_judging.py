"""The one judge-reply parser and env-published judges (turngym.core.judging)."""

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turngym.core.judging import EnvJudge, JudgeParseError, Rubric, env_judge, parse_judge_reply
from turngym.core.registry import register, registry

RUBRIC = Rubric(
    process=("breadth: wide", "detail: deep"),
    answer=("feasibility: works", "clarity: clear", "relevance: on topic"),
    process_weight=0.6,
    answer_weight=0.4,
)
scores = st.floats(min_value=0, max_value=10, allow_nan=False)
proc = st.lists(scores, min_size=2, max_size=2)
ans = st.lists(scores, min_size=3, max_size=3)


def expected(p, a):
    return 0.6 * sum(p) / len(p) + 0.4 * sum(a) / len(a)


def arena_reply(ap, aa, bp, ba):
    keys_p, keys_a = RUBRIC.keys("process"), RUBRIC.keys("answer")
    return {
        "path_scores": {
            "Agent_A": dict(zip(keys_p, ap, strict=True)),
            "Agent_B": dict(zip(keys_p, bp, strict=True)),
        },
        "answer_scores": {
            "Agent_A": dict(zip(keys_a, aa, strict=True)),
            "Agent_B": dict(zip(keys_a, ba, strict=True)),
        },
    }


def list_reply(ap, aa, bp, ba):
    return {"A": {"process": ap, "answer": aa}, "B": {"process": bp, "answer": ba}}


def test_rubric_keys_and_combine():
    assert RUBRIC.keys("process") == ("breadth", "detail")
    assert RUBRIC.keys("answer") == ("feasibility", "clarity", "relevance")
    assert RUBRIC.combine([10, 0], [3, 3, 3]) == pytest.approx(0.6 * 5 + 0.4 * 3)
    with pytest.raises(ValueError, match="process_keys"):
        Rubric(("a",), ("b",), 0.5, 0.5, process_keys=("x", "y"))


@settings(max_examples=60)
@given(proc, ans, proc, ans, st.sampled_from([arena_reply, list_reply]), st.text(max_size=30))
def test_valid_replies_of_either_shape_give_the_weighted_scores(ap, aa, bp, ba, shape, prose):
    prose = prose.replace("{", "").replace("}", "")
    text = f"{prose}\n```json\n{json.dumps(shape(ap, aa, bp, ba))}\n```\n{prose}"
    a, b = parse_judge_reply(text, RUBRIC)
    assert a == pytest.approx(expected(ap, aa)) and b == pytest.approx(expected(bp, ba))


@settings(max_examples=60)
@given(
    proc,
    ans,
    st.integers(0, 4),
    st.one_of(
        st.floats(min_value=10.001, max_value=1e6),
        st.floats(max_value=-0.001, min_value=-1e6),
        st.just(math.nan),
        st.booleans(),
        st.text(alphabet="abcxyz", min_size=1, max_size=4),
        st.none(),
        st.lists(st.integers(0, 10), max_size=2),
    ),
    st.sampled_from([arena_reply, list_reply]),
)
def test_one_bad_score_is_an_error_never_a_score(ap, aa, slot, bad, shape):
    """Out of range, NaN, a bool, a word, null or a list in place of a score: JudgeParseError."""
    vals = [*ap, *aa]
    vals[slot] = bad
    reply = shape(vals[:2], vals[2:], ap, aa)
    with pytest.raises(JudgeParseError):
        parse_judge_reply(json.dumps(reply), RUBRIC)


@settings(max_examples=80)
@given(st.text(max_size=200))
def test_arbitrary_text_parses_to_valid_scores_or_raises(text):
    try:
        a, b = parse_judge_reply(text, RUBRIC)
    except JudgeParseError as e:
        assert str(e)  # a message that says what is wrong
    else:  # only possible if the text holds a valid reply
        assert 0 <= a <= 10 and 0 <= b <= 10


@settings(max_examples=40)
@given(st.dictionaries(st.sampled_from(["A", "B", "Agent_A", "path_scores", "x"]), st.integers(0, 10)))
def test_replies_missing_a_side_raise(data):
    with pytest.raises(JudgeParseError, match="no scores for|must be"):
        parse_judge_reply(json.dumps(data), RUBRIC)


def test_combined_scores_are_the_documented_fallback_and_are_checked():
    only = {"combined_scores": {"Agent_A": 7.5, "Agent_B": "6"}}
    assert parse_judge_reply(json.dumps(only), RUBRIC) == (7.5, 6.0)
    # dimension scores win over combined scores when complete
    full = {
        **arena_reply([10, 10], [10, 10, 10], [0, 0], [0, 0, 0]),
        "combined_scores": {"Agent_A": 1, "Agent_B": 1},
    }
    assert parse_judge_reply(json.dumps(full), RUBRIC) == (pytest.approx(10.0), pytest.approx(0.0))
    # incomplete dimensions fall back side by side
    partial = arena_reply([10, 10], [10, 10, 10], [0, 0], [0, 0, 0])
    del partial["path_scores"]["Agent_B"]["detail"]
    partial["combined_scores"] = {"Agent_B": 4}
    assert parse_judge_reply(json.dumps(partial), RUBRIC) == (pytest.approx(10.0), 4.0)
    for bad in (11, -1, True, "high"):
        with pytest.raises(JudgeParseError, match="combined_scores"):
            parse_judge_reply(json.dumps({"combined_scores": {"Agent_A": bad, "Agent_B": 5}}), RUBRIC)


def test_short_lists_and_single_numbers_average_the_given_scores():
    reply = {"A": {"process": 4, "answer": [8]}, "B": {"process": [0, 2], "answer": [1, 2, 3]}}
    assert parse_judge_reply(json.dumps(reply), RUBRIC) == pytest.approx((0.6 * 4 + 0.4 * 8, 0.6 + 0.8))
    too_long = {"A": {"process": [1, 2, 3], "answer": [1]}, "B": {"process": [1], "answer": [1]}}
    with pytest.raises(JudgeParseError, match="1 to 2 scores"):
        parse_judge_reply(json.dumps(too_long), RUBRIC)


def test_the_first_json_object_is_read_past_broken_braces():
    good = json.dumps(list_reply([5, 5], [5, 5, 5], [1, 1], [1, 1, 1]))
    assert parse_judge_reply("I think {A wins} overall. " + good, RUBRIC) == pytest.approx((5.0, 1.0))
    for text in ("", "no json", "[1, 2]", "{broken", None):
        with pytest.raises(JudgeParseError, match="JSON"):
            parse_judge_reply(text, RUBRIC)


def test_envs_publish_their_judge_through_the_registry():
    travel = env_judge("travel-open")
    assert isinstance(travel, EnvJudge) and env_judge("travel") is travel
    assert env_judge("travel-planner-v0") is travel
    assert travel.rubric.keys("answer") == ("relevance", "feasibility", "details", "clarity")
    assert travel.messages is not None and travel.pairwise is not None
    assert env_judge("arith") is None and env_judge("no-such-env") is None

    published = EnvJudge(RUBRIC)
    import sys
    import types

    mod = types.ModuleType("_judging_test_mod")
    mod.JUDGE = published
    sys.modules["_judging_test_mod"] = mod
    try:
        register("judged-toy-v0", "turngym.envs.arith:ArithEnv", judge="_judging_test_mod:JUDGE")
        assert env_judge("judged-toy") is published
        assert published.parse(json.dumps({"combined_scores": {"A": 3, "B": 4}})) == (3.0, 4.0)
    finally:
        registry.unregister("judged-toy-v0")
        del sys.modules["_judging_test_mod"]
