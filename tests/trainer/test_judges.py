"""Pairwise judges: both orders, rubric weights, JSON parsing with retries, ties and failures counted."""

import json

import pytest

from turngym.trainer.credit import run_tournament
from turngym.trainer.judges import (
    RUBRICS,
    LLMJudge,
    ProgrammaticJudge,
    backend_complete,
    outcome_judge,
    parse_scores,
)

from .helpers import make_traj


def reply(a_p, a_a, b_p, b_a):
    return json.dumps({"A": {"process": a_p, "answer": a_a}, "B": {"process": b_p, "answer": b_a}})


def test_programmatic_judge_adds_both_orders():
    calls = []

    def biased(a, b):  # prefers whoever is shown first, plus the true outcome
        calls.append((a.outcome, b.outcome))
        return a.outcome + 1.0, b.outcome

    judge = ProgrammaticJudge(biased)
    good, bad = make_traj([1.0]), make_traj([0.0])
    assert judge(good, bad) == (1.0 + 1.0 + 1.0, 0.0 + 0.0 + 1.0)  # the position bonus cancels
    assert calls == [(1.0, 0.0), (0.0, 1.0)]
    assert judge(good, make_traj([1.0])) == (3.0, 3.0)
    assert judge.metrics == {"judge/matches": 2, "judge/ties": 1}
    assert outcome_judge()(good, bad) == (2.0, 0.0)


def test_parse_scores_rubric_weights():
    travel = RUBRICS["travel"]
    a, b = parse_scores("here: " + reply([10, 10, 10], [0, 0, 0], [5, 5, 5], [10, 10, 10]) + " done", travel)
    assert (a, b) == pytest.approx((0.6 * 10, 0.6 * 5 + 0.4 * 10))
    research = RUBRICS["research"]
    assert parse_scores(reply([4], [8], [0], [2]), research) == pytest.approx((6.0, 1.0))
    for bad in [
        "no json",
        "{not json}",
        json.dumps({"A": {}}),
        reply([11], [0], [0], [0]),
        reply(["x"], [1], [1], [1]),
    ]:
        with pytest.raises(ValueError):
            parse_scores(bad, research)


def test_llm_judge_both_orders_retries_and_failures():
    replies = iter(["garbage", reply([10], [10], [0], [0]), reply([2], [2], [8], [8])])
    prompts = []

    def complete(prompt):
        prompts.append(prompt)
        return next(replies)

    judge = LLMJudge(complete, "research", retries=2)
    a, b = make_traj([1.0]), make_traj([0.0])
    # order (a,b): garbage then A=10,B=0; order (b,a): A(=b)=2, B(=a)=8
    assert judge(a, b) == pytest.approx((10 + 8, 0 + 2))
    assert judge.metrics == {"judge/retries": 1, "judge/matches": 1}
    assert "Attempt A" in prompts[0] and "act 0" in prompts[0] and "answer is correct" in prompts[0]

    never = LLMJudge(lambda p: "I refuse", retries=1)
    assert never(a, b) == (10.0, 10.0)  # both orders fail -> tie
    assert never.metrics == {
        "judge/retries": 2,
        "judge/parse_failures": 2,
        "judge/matches": 1,
        "judge/ties": 1,
    }


def test_llm_judge_survives_a_dead_backend():
    def dead(prompt):
        raise ConnectionError("refused")

    judge = LLMJudge(dead, retries=0)
    assert judge(make_traj([1.0]), make_traj([0.0])) == (10.0, 10.0)
    assert judge.metrics["judge/backend_errors"] == 2 and judge.metrics["judge/parse_failures"] == 2


def test_llm_judge_in_a_tournament_with_async_complete():
    async def complete(prompt):  # scores by the outcome visible in the attempts' text
        a_txt, b_txt = prompt.split("# Attempt A")[1].split("# Attempt B")
        sa, sb = (10 if "WIN" in a_txt else 0), (10 if "WIN" in b_txt.split("Score each")[0] else 0)
        return reply([sa], [sa], [sb], [sb])

    trajs = [make_traj([0.0]) for _ in range(5)]
    trajs[3].turns[0].action.content = "WIN"
    judge = LLMJudge(complete)
    res = run_tournament("single_elimination", 5, lambda i, j: judge(trajs[i], trajs[j]), workers=3)
    assert res.ranking[0] == 3
    assert judge.metrics["judge/matches"] == res.num_matches


def test_llm_judge_through_a_real_backend_counts_parse_failures():
    """A random-init model never writes valid JSON: every match is a counted tie, never a crash."""
    from turngym.agents.hf import HFBackend
    from turngym.agents.models import load_model, load_tokenizer

    tok = load_tokenizer("tiny")
    backend = HFBackend(load_model("tiny", device="cpu"), tok, max_batch_size=2)
    judge = LLMJudge(backend_complete(backend, tok, max_tokens=8), retries=0)
    assert judge(make_traj([1.0]), make_traj([0.0])) == (10.0, 10.0)
    assert judge.metrics["judge/parse_failures"] == 2


def test_env_rubrics_come_from_the_env_and_errors_name_the_options():
    from turngym.core.judging import env_judge

    travel = env_judge("travel-open")
    assert RUBRICS["travel"] is travel.rubric and RUBRICS["travel-open"] is travel.rubric
    assert len(travel.rubric.answer) == 4  # ArenaRL's four answer dimensions, not a trainer copy
    with pytest.raises(KeyError, match="research.*publishes a judge"):
        RUBRICS["nonsense"]
    with pytest.raises(KeyError, match="research"):
        LLMJudge(lambda p: "", "nonsense")


def test_llm_judge_with_an_env_rubric_sends_the_env_prompt_and_parses_its_reply():
    from turngym.envs.travel import judge as travel

    def arena(ap, aa, bp, ba):
        return json.dumps(
            {
                "path_scores": {
                    "Agent_A": dict(zip(travel.PROCESS_DIMENSIONS, ap, strict=True)),
                    "Agent_B": dict(zip(travel.PROCESS_DIMENSIONS, bp, strict=True)),
                },
                "answer_scores": {
                    "Agent_A": dict(zip(travel.ANSWER_DIMENSIONS, aa, strict=True)),
                    "Agent_B": dict(zip(travel.ANSWER_DIMENSIONS, ba, strict=True)),
                },
            }
        )

    seen = []

    def complete(messages):
        seen.append(messages)
        return arena([9] * 3, [9] * 4, [1] * 3, [1] * 4)

    judge = LLMJudge(complete, "travel", retries=0)
    assert judge(make_traj([1.0]), make_traj([0.0])) == pytest.approx((9 + 1, 1 + 9))
    assert seen[0][0] == {"role": "system", "content": travel.RUBRIC_PROMPT}
    assert judge.metrics == {"judge/matches": 1, "judge/ties": 1}


def test_arena_judges_default_to_what_the_env_publishes():
    from turngym.envs.travel.judge import pairwise_scores
    from turngym.trainer.credit.arena import ArenaSettings, build_judge

    prog = build_judge(ArenaSettings(), "travel-open")
    assert isinstance(prog, ProgrammaticJudge) and prog.fn is pairwise_scores
    good, bad = make_traj([1.0]), make_traj([0.0])
    assert build_judge(ArenaSettings(), "arith")(good, bad) == (2.0, 0.0)  # outcome comparison
    assert build_judge(ArenaSettings(), None)(good, bad) == (2.0, 0.0)
    llm = {"judge": "llm", "judge_base_url": "http://localhost:1/v1", "judge_model": "m"}
    assert len(build_judge(ArenaSettings(**llm), "travel-open").rubric.answer) == 4
    assert build_judge(ArenaSettings(**llm), "arith").rubric is RUBRICS["research"]
    assert build_judge(ArenaSettings(**llm, rubric="research"), "travel-open").rubric is RUBRICS["research"]
