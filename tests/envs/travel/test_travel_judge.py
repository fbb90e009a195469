"""Pairwise judges for travel-open: programmatic scores, LLM rubric prompt and reply parsing."""

from __future__ import annotations

import json

import pytest

import turngym
from turngym.core.types import Message, Trajectory
from turngym.envs.travel import judge


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def play(env, seed: int, actions) -> Trajectory:
    obs, info = env.reset(seed=seed, options={"level": "hard", "days": 5})
    traj = Trajectory.start(obs, info)
    for action in actions(env, info):
        obs, r, term, trunc, info = env.step(action)
        traj.record_step(Message(role="assistant", content=action), obs, r, term, trunc, info)
        if term or trunc:
            break
    return traj


def expert(env, info):
    while True:
        yield env.expert_action()


def lazy(env, info):  # no searches, a plan with the wrong accommodation everywhere
    plan = [dict(d) for d in info["reference"]["plan"]]
    for d in plan:
        if d["accommodation"] != "-":
            d["accommodation"] = "Nowhere Inn, " + d["accommodation"].rsplit(", ", 1)[1]
    yield call("submit_plan", plan=plan)


def silent(env, info):
    yield call("search_cities", state="Ohio")


@pytest.fixture(scope="module")
def trajectories(cache_dir, small_db):
    env = turngym.make("travel-open", db_seed=3, n_cities=150, n_days=14, cache_dir=cache_dir, max_turns=20)
    out = {name: play(env, 9, fn) for name, fn in (("expert", expert), ("lazy", lazy), ("silent", silent))}
    env.close()
    return out


def test_programmatic_judge_ranks_expert_over_lazy_over_silent(trajectories):
    s = {k: judge.score_trajectory(t) for k, t in trajectories.items()}
    assert s["expert"] > s["lazy"] > s["silent"] >= 0.0
    assert 0 <= min(s.values()) and max(s.values()) <= 10
    a, b = judge.pairwise_scores(trajectories["expert"], trajectories["lazy"])
    b2, a2 = judge.pairwise_scores(trajectories["lazy"], trajectories["expert"])
    assert (a, b) == (a2, b2) and a > b
    # trajectories round-trip through JSON (the trainer stores them) and score the same
    dumped = json.loads(trajectories["lazy"].to_json())
    assert judge.score_trajectory(dumped) == pytest.approx(s["lazy"])


def test_features_follow_the_rubric_weights(trajectories):
    f = judge.features_from_trajectory(trajectories["expert"])
    process = [f[f"process.{d}"] for d in judge.PROCESS_DIMENSIONS]
    answer = [f[f"answer.{d}"] for d in judge.ANSWER_DIMENSIONS]
    assert f["combined"] == pytest.approx(0.6 * sum(process) / 3 + 0.4 * sum(answer) / 4)
    silent = judge.features_from_trajectory(trajectories["silent"])
    assert all(silent[f"answer.{d}"] == 0.0 for d in judge.ANSWER_DIMENSIONS)


def test_travel_planner_trajectories_are_scored_from_components(cache_dir, small_db):
    env = turngym.make("travel-planner", db_seed=3, n_cities=150, n_days=14, cache_dir=cache_dir)
    good, bad = play(env, 2, expert), play(env, 2, lazy)
    env.close()
    assert "judge_features" not in good.turns[-1].info
    assert judge.score_trajectory(good) > judge.score_trajectory(bad)


def test_works_as_the_trainers_programmatic_judge(trajectories):
    from turngym.trainer.judges import ProgrammaticJudge

    pj = ProgrammaticJudge(judge.pairwise_scores)
    a, b = pj(trajectories["expert"], trajectories["silent"])
    assert a > b and a == pytest.approx(2 * judge.score_trajectory(trajectories["expert"]))


def test_llm_prompt_holds_query_paths_and_answers(trajectories):
    msgs = judge.judge_messages(trajectories["expert"], trajectories["lazy"])
    assert msgs[0]["role"] == "system" and "0.6 * Overall_P + 0.4 * Overall_A" in msgs[0]["content"]
    user = msgs[1]["content"]
    assert trajectories["expert"].prompt[1].content in user
    path_a = user.split("<PATH_A>")[1].split("</PATH_A>")[0]
    path_b = user.split("<PATH_B>")[1].split("</PATH_B>")[0]
    assert "search_restaurants" in path_a and path_b.strip() == "(no tool calls)"
    answer_b = user.split("<ANSWER_B>")[1].split("</ANSWER_B>")[0]
    assert "Day 1:" in answer_b and "Nowhere Inn" in answer_b
    silent = judge.render_path_and_answer(trajectories["silent"])
    assert silent[1] == "(no answer)"


def reply(a_p, a_a, b_p, b_a, **extra) -> str:
    data = {
        "analysis": {"path_A": "...", "path_B": "..."},
        "path_scores": {
            "Agent_A": dict(zip(judge.PROCESS_DIMENSIONS, a_p, strict=True)),
            "Agent_B": dict(zip(judge.PROCESS_DIMENSIONS, b_p, strict=True)),
        },
        "answer_scores": {
            "Agent_A": dict(zip(judge.ANSWER_DIMENSIONS, a_a, strict=True)),
            "Agent_B": dict(zip(judge.ANSWER_DIMENSIONS, b_a, strict=True)),
        },
        "winner": "Agent_A",
        **extra,
    }
    return "Here is my judgement:\n```json\n" + json.dumps(data) + "\n```"


def test_parse_judge_reply():
    a, b = judge.parse_judge_reply(reply([9, 8, 7], [10, 10, 6, 8], [3, 3, 3], [5, 5, 5, 5]))
    assert a == pytest.approx(0.6 * 8 + 0.4 * 8.5) and b == pytest.approx(0.6 * 3 + 0.4 * 5)
    only_combined = json.dumps({"combined_scores": {"Agent_A": 7.5, "Agent_B": 6}})
    assert judge.parse_judge_reply(only_combined) == (7.5, 6.0)


@pytest.mark.parametrize(
    "text",
    [
        "no json here",
        "{broken",
        "[1, 2]",
        json.dumps({"combined_scores": {"Agent_A": 1}}),
        reply([11, 8, 7], [10, 10, 6, 8], [3, 3, 3], [5, 5, 5, 5]),
    ],
)
def test_parse_judge_reply_rejects_bad_replies(text):
    with pytest.raises(ValueError):
        judge.parse_judge_reply(text)


def test_judge_module_is_light():
    import subprocess
    import sys

    code = "import sys, turngym.envs.travel.judge; print('pandas' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_llm_pairwise_retries_then_ties(trajectories):
    replies = iter(["garbage", reply([9, 9, 9], [9, 9, 9, 9], [1, 1, 1], [1, 1, 1, 1])])
    seen = []

    def complete(messages):
        seen.append(messages)
        return next(replies)

    fn = judge.llm_pairwise(complete, retries=2)
    a, b = fn(trajectories["expert"], trajectories["lazy"])
    assert (a, b) == (pytest.approx(9.0), pytest.approx(1.0)) and len(seen) == 2
    assert seen[0][0]["content"] == judge.RUBRIC_PROMPT
    never = judge.llm_pairwise(lambda m: "no idea", retries=1)
    assert never(trajectories["expert"], trajectories["lazy"]) == (5.0, 5.0)
