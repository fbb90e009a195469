"""swe-docker end to end on the real daemon: conformance, expert, outcome levels, faults, tools."""

from __future__ import annotations

import json

import pytest

import turngym
from turngym.sandboxes.docker import docker_client

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture(scope="module")
def env(one_task_per_package):
    e = turngym.make(
        "swe-docker-v0",
        task_ids=[t.instance_id for t in one_task_per_package],
        max_turns=9,
        command_timeout=3,
        max_output_chars=2_000,
    )
    yield e
    e.close()


def test_conformance(one_task_per_package):
    from turngym.testing import check_env

    ids = [t.instance_id for t in one_task_per_package[:2]]
    report = check_env("swe-docker-v0", task_ids=ids, max_turns=3, seeds=(0,))
    report.raise_for_failures()


def test_expert_resolves_a_task_of_every_package(env, one_task_per_package):
    assert len(one_task_per_package) >= 3
    for task in one_task_per_package:
        env.reset(options={"task_id": task.instance_id})
        for _ in range(5):
            obs, reward, terminated, truncated, info = env.step(env.expert_action())
            if terminated:
                break
        assert terminated and reward == 1.0, info.get("grade")
        comps = info["reward_components"]
        assert comps["outcome_level"] == 3.0 and comps["resolved"] == 1.0 and comps["format_ok"] == 1.0


def test_outcome_levels(env, one_task_per_package):
    task = one_task_per_package[0]
    # submit without edits: empty patch
    env.reset(options={"task_id": task.instance_id})
    _, reward, terminated, _, info = env.step(call("submit"))
    assert terminated and reward == 0.0 and info["reward_components"]["outcome_level"] == 1.0
    # an edit that does not fix the bug, plus edits to the tests that are dropped before grading
    env.reset(options={"task_id": task.instance_id})
    src = task.expert_edits[0]["path"]
    _, _, _, _, info = env.step(call("bash", command=f"echo '# touched' >> {src}"))
    test_file = task.test_files[0]
    env.step(call("bash", command=f"printf 'def test_ok():\\n    pass\\n' > {test_file}"))
    obs, reward, terminated, _, info = env.step(call("submit"))
    assert "dropped" in obs[0].content and test_file in obs[0].content
    assert reward == 0.0 and info["reward_components"]["outcome_level"] == 2.0
    assert info["grade"]["applied"] and not info["grade"]["resolved"]
    # no submit before the turn limit
    env.reset(options={"task_id": task.instance_id})
    for _ in range(env.max_turns):
        _, reward, terminated, truncated, info = env.step(call("bash", command="true"))
    assert truncated and not terminated and info["reward_components"]["outcome_level"] == 0.0


def test_gating_components_per_turn(env, one_task_per_package):
    env.reset(options={"task_id": one_task_per_package[0].instance_id})
    _, _, _, _, info = env.step("no tool call here")
    assert info["reward_components"]["format_ok"] == 0.0 and info["invalid_action"]
    _, _, _, _, info = env.step(call("bash", command="python3 -m pytest -q -x --co >/dev/null; echo done"))
    assert info["reward_components"]["tests_run"] == 1.0
    path = "/testbed/" + one_task_per_package[0].expert_edits[0]["path"]
    _, _, _, _, info = env.step(
        call("file_editor", command="insert", path=path, insert_line=0, new_str="# hi")
    )
    assert info["reward_components"]["edit_applied"] == 1.0
    assert info["reward_components"]["format_ok"] == 1.0


def test_timeouts_and_huge_output(env, one_task_per_package):
    env.reset(options={"task_id": one_task_per_package[0].instance_id})
    obs, _, _, _, info = env.step(call("bash", command="sleep 60"))
    assert "<returncode>124</returncode>" in obs[0].content and "killed" in obs[0].content
    obs, _, _, _, _ = env.step(call("bash", command="seq 1 1000000"))
    text = obs[0].content
    assert "truncated" in text and len(text) < 5_000 and "1000000" in text
    obs, _, _, _, _ = env.step(call("bash", command="echo fine"))
    assert "fine" in obs[0].content


def test_container_killed_mid_episode(env, one_task_per_package):
    _, info = env.reset(options={"task_id": one_task_per_package[0].instance_id})
    docker_client().api.kill(info["container"])
    obs, reward, terminated, _, info = env.step(call("bash", command="echo hi"))
    assert terminated and reward == 0.0
    assert "sandbox" in obs[0].content.lower() and info["sandbox_error"]
    _, info = env.reset(options={"task_id": one_task_per_package[0].instance_id})  # the next episode works
    obs, _, _, _, _ = env.step(call("bash", command="echo back"))
    assert "back" in obs[0].content


def test_file_editor(env, one_task_per_package):
    task = one_task_per_package[0]
    env.reset(options={"task_id": task.instance_id})
    obs, *_ = env.step(call("file_editor", command="view", path="/testbed"))
    assert "/testbed/" in obs[0].content and ".git" not in obs[0].content
    obs, *_ = env.step(
        call("file_editor", command="create", path="/testbed/notes.txt", file_text="a\nb\nb\n")
    )
    assert "created" in obs[0].content
    obs, _, _, _, info = env.step(
        call("file_editor", command="str_replace", path="/testbed/notes.txt", old_str="b", new_str="c")
    )
    assert "appears 2 times" in info["error"]
    env.step(
        call("file_editor", command="str_replace", path="/testbed/notes.txt", old_str="a\n", new_str="z\n")
    )
    env.step(call("file_editor", command="undo_edit", path="/testbed/notes.txt"))
    obs, *_ = env.step(call("file_editor", command="view", path="/testbed/notes.txt", view_range=[1, 1]))
    assert "\ta" in obs[0].content
    _, _, _, _, info = env.step(
        call("file_editor", command="create", path="/testbed/../etc/evil", file_text="x")
    )
    assert "outside the repository" in info["error"]
    _, _, _, _, info = env.step(call("file_editor", command="view", path="/testbed/nope.py"))
    assert "no such file" in info["error"]


def test_search(env, one_task_per_package):
    task = one_task_per_package[0]
    env.reset(options={"task_id": task.instance_id})
    fn = task.mutation["function"].split(".")[-1]
    obs, *_ = env.step(call("search", search_term=f"def {fn}"))
    assert task.mutation["path"] in obs[0].content
    obs, *_ = env.step(call("search", search_term="zzz-not-there-zzz"))
    assert "No matches" in obs[0].content
