"""The travel-planner and travel-open envs: conformance, expert, rewards, verifier, bad input."""

from __future__ import annotations

import json

import pytest

import turngym
from turngym.core.types import Trajectory
from turngym.testing import check_env


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def run_expert(env, seed: int, options: dict | None = None):
    obs, info = env.reset(seed=seed, options=options)
    traj = Trajectory.start(obs, info)
    while True:
        action = env.expert_action()
        obs, reward, term, trunc, info = env.step(action)
        from turngym.core.types import Message

        traj.record_step(Message(role="assistant", content=action), obs, reward, term, trunc, info)
        if term or trunc:
            return traj, reward, info


@pytest.mark.parametrize("env_id", ["travel-planner", "travel-open"])
def test_conformance(env_id, env_kwargs):
    report = check_env(env_id, **env_kwargs)
    report.raise_for_failures()


@pytest.fixture
def env(env_kwargs):
    e = turngym.make("travel-planner", **env_kwargs)
    yield e
    e.close()


@pytest.mark.parametrize("level", ["easy", "medium", "hard"])
def test_expert_passes(env, level):
    for seed in range(3):
        traj, reward, info = run_expert(env, seed, {"level": level})
        assert reward == 1.0 and traj.terminated
        comps = info["reward_components"]
        assert comps["pass"] == 1.0 and comps["verifier"] == 1.0
        assert all(v == 1.0 for k, v in comps.items() if k.startswith(("cs.", "hard.")))
        assert info["plan_evaluation"]["final_pass"] and info["grounding"]["rate"] == 1.0
        assert all(t.reward_components.get("tool_ok") == 1.0 for t in traj.turns[:-1])
        assert traj.total_reward == 1.0  # only `pass` counts in the scalar reward
        assert traj.reference["plan"] and traj.reference["query"]["level"] == level


def test_reset_is_deterministic_and_options_apply(env):
    a, ia = env.reset(seed=5, options={"level": "hard", "days": 7})
    b, ib = env.reset(seed=5, options={"level": "hard", "days": 7})
    assert a == b and ia["task_id"] == ib["task_id"] and ia["level"] == "hard" and ia["days"] == 7
    secret = ia["reference"]["plan"][0]["accommodation"]
    assert all(secret not in m.content for m in a)  # the gold plan never leaks into the observation


def test_tools_return_compact_tables(env):
    obs, info = env.reset(seed=2, options={"days": 3})
    q = info["reference"]["query"]
    _, _, _, _, step = env.step(call("search_restaurants", city=q["dest"]))
    text = step["tool_results"][0].content
    header = text.splitlines()[1]
    assert header == "Name | Average Cost | Cuisines | Aggregate Rating"
    _, _, _, _, step = env.step(
        call("search_flights", origin=q["org"], destination=q["dest"], date=q["date"][0])
    )
    res = step["tool_results"][0]
    assert res.ok and (
        res.content.startswith("Flight Number | Price") or res.content.startswith("There is no flight")
    )
    _, _, _, _, step = env.step(call("search_cities", state="texas"))
    assert step["tool_results"][0].content.startswith("Cities in Texas: ")
    _, _, _, _, step = env.step(call("notebook_write", text="cheap flight F1"))
    assert step["tool_results"][0].content == "Saved note 1."


@pytest.mark.parametrize(
    "action,needle",
    [
        (call("search_restaurants", city="Atlantis"), "unknown city 'Atlantis'"),
        (call("search_restaurants", city="Chicagoo"), "Did you mean Chicago"),
        (
            call("search_flights", origin="Chicago", destination="Dallas", date="2030-01-01"),
            "no data for 2030-01-01",
        ),
        (call("search_flights", origin="Chicago", destination="Dallas", date="March 3"), "bad date"),
        (call("distance", origin="Chicago", destination="Dallas", mode="rocket"), "unknown mode"),
        (call("search_cities", state="Narnia"), "unknown state"),
        (call("submit_plan", plan="{not json"), "not valid JSON"),
        (call("submit_plan", plan=[]), "non-empty"),
        (call("submit_plan", plan=[1, 2]), "Input should be an object"),
        (call("submit_plan", plan="[1, 2]"), "day 1 of the plan must be an object"),
        (call("submit_plan", plan=[{"days": "one"}]), "day 1 of the plan is malformed"),
        (call("notebook_write", text="  "), "empty"),
        (call("search_flights", origin="Chicago"), "missing required argument"),
    ],
)
def test_bad_input_is_an_error_observation(env, action, needle):
    env.reset(seed=0)
    obs, reward, term, trunc, info = env.step(action)
    assert not term and reward == 0.0
    assert info["invalid_action"] and needle in info["error"], info["error"]
    assert needle in obs[0].content
    _, reward, term, _, _ = env.step(env.expert_action())  # the episode goes on
    assert not term


def test_unknown_city_in_plan_and_missing_fields_fail_checks(env):
    _, info = env.reset(seed=1, options={"days": 3})
    plan = info["reference"]["plan"]
    bad_city = [dict(d) for d in plan]
    bad_city[1]["current_city"] = "Atlantis"
    _, reward, term, _, step = env.step(call("submit_plan", plan=bad_city))
    assert term and reward == 0.0
    assert step["reward_components"]["cs.reasonable_city_route"] == 0.0
    assert any("Atlantis" in f for f in step["plan_evaluation"]["failures"])
    env.reset(seed=1, options={"days": 3})
    missing = [{k: v for k, v in d.items() if k != "lunch"} for d in plan]
    _, reward, term, _, step = env.step(call("submit_plan", plan=json.dumps(missing)))
    assert term and reward == 0.0 and step["reward_components"]["cs.complete_information"] == 0.0
    assert not any(k.startswith("hard.") for k in step["reward_components"])


def test_verifier_needs_the_searches(env):
    """Submitting the right plan without looking anything up passes the checks but not the verifier."""
    _, info = env.reset(seed=4)
    _, reward, term, _, step = env.step(call("submit_plan", plan=info["reference"]["plan"]))
    assert term and reward == 1.0
    assert step["reward_components"]["verifier"] == 0.0
    assert all(item["turn"] is None for item in step["grounding"]["items"])
    # half the searches: only the items they returned are grounded, credited to their turns
    _, info = env.reset(seed=4)
    searches = info["reference"]["searches"]
    for s in searches[: len(searches) // 2]:
        env.step(call(s["name"], **s["arguments"]))
    _, _, _, _, step = env.step(call("submit_plan", plan=info["reference"]["plan"]))
    rate = step["reward_components"]["verifier"]
    assert 0.0 < rate < 1.0
    support = step["grounding"]["support_by_turn"]
    assert support and all(1 <= s["turn"] <= len(searches) // 2 and s["items"] >= 1 for s in support)


def test_truncation_without_a_plan_pays_zero(env_kwargs):
    e = turngym.make("travel-planner", max_turns=2, **env_kwargs)
    _, info = e.reset(seed=0)
    e.step(call("search_cities", state="Ohio"))
    _, reward, term, trunc, step = e.step(call("search_cities", state="Utah"))
    assert trunc and not term and reward == 0.0 and step["reward_components"]["pass"] == 0.0
    e.close()


def test_queries_from_a_travelplanner_file(tmp_path, env_kwargs, small_db):
    import numpy as np

    from turngym.envs.travel.queries import sample_task

    task = sample_task(small_db, np.random.default_rng(0), level="medium", days=5)
    path = tmp_path / "val.jsonl"
    path.write_text(json.dumps(task.query.to_travelplanner()) + "\n")
    e = turngym.make("travel-planner", queries_path=str(path), **env_kwargs)
    obs, info = e.reset(seed=0, options={"query_index": 0})
    assert obs[1].content == task.query.query and "plan" not in info["reference"]
    plan = [d.unit() for d in task.plan]
    _, reward, term, _, _ = e.step(call("submit_plan", plan=plan))
    assert term and reward == 1.0
    # no gold plan here: the expert falls back to the greedy-cheap planner, which solves it too
    e.reset(seed=0, options={"query_index": 0})
    while (action := e.expert_action()) is not None:
        _, reward, term, trunc, info = e.step(action)
    assert term and reward == 1.0 and info["reward_components"]["verifier"] == 1.0
    with pytest.raises(ValueError, match="out of range"):
        e.reset(seed=0, options={"query_index": 3})
    e.close()


def test_travel_open_is_neutral_and_carries_judge_features(env_kwargs):
    e = turngym.make("travel-open", **env_kwargs)
    traj, reward, info = run_expert(e, 3, {"level": "hard"})
    assert reward == 0.0 and traj.total_reward == 0.0
    assert "pass" not in info["reward_components"] and info["reward_components"]["verifier"] == 1.0
    feats = traj.turns[-1].info["judge_features"]
    assert feats["combined"] > 8.0 and feats["process.relevance"] == 10.0
    assert "Ideally" in traj.prompt[1].content
    e.close()


def test_constructor_validates(env_kwargs):
    with pytest.raises(ValueError):
        turngym.make("travel-planner", level="extreme", **env_kwargs)
    with pytest.raises(ValueError):
        turngym.make("travel-planner", days=4, **env_kwargs)
