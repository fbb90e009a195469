"""swe-docker's state key on the real daemon: it is the repository's real state (however it was reached:
the editor, ``sed -i`` or ``echo >`` through bash, untracked files), a fork's key is its parent's, and a
container that cannot be keyed gives a key no other state has, said in ``info``, never a crash."""

from __future__ import annotations

import json
import os
import time

import pytest

import turngym
from turngym.sandboxes.docker import LABEL_PID, docker_client, managed_containers

pytestmark = [pytest.mark.docker]


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def step_key(env, action: str) -> str:
    obs, _, _, _, info = env.step(action)
    assert "state_key_error" not in info, info["state_key_error"]
    assert info["state_key"] == env._state_key()
    return info["state_key"]


def bash_key(env, command: str) -> str:
    return step_key(env, call("bash", command=command))


def mine() -> set[str]:
    return {c.name for c in managed_containers() if c.labels.get(LABEL_PID) == str(os.getpid())}


@pytest.fixture(scope="module")
def task(shipped_tasks):
    return shipped_tasks[0]


@pytest.fixture(scope="module")
def env(task, base_image):
    before = mine()
    e = turngym.make(
        "swe-docker-v0", task_ids=[task.instance_id], max_turns=20, command_timeout=20, pool_warm=0
    )
    yield e
    e.close()
    deadline = time.monotonic() + 60
    while mine() - before and time.monotonic() < deadline:  # releases run in the background
        time.sleep(0.2)
    assert mine() - before == set(), "state key tests leaked containers"


def start(env) -> str:
    _, info = env.reset(seed=0)
    assert "state_key_error" not in info
    return info["state_key"]


def test_the_same_files_by_different_routes_give_the_same_key(env, task):
    src = f"/testbed/{task.expert_edits[0]['path']}"
    pristine = start(env)
    assert pristine == start(env), "two fresh episodes of one task start in one state"
    assert bash_key(env, "ls; git status --porcelain") == pristine, "a read-only command changed the key"
    by_editor = step_key(
        env, call("file_editor", command="insert", path=src, insert_line=0, new_str="# marker")
    )
    assert by_editor != pristine
    assert start(env) == pristine
    by_sed = bash_key(env, f"sed -i '1i # marker' {src}")
    assert by_sed == by_editor, "sed -i reached the editor's files but got another key"
    # the editor's create and bash's echo > reach one untracked file
    created = step_key(env, call("file_editor", command="create", path="/testbed/new.txt", file_text="hi\n"))
    assert created != by_sed
    start(env)
    bash_key(env, f"sed -i '1i # marker' {src}")
    assert bash_key(env, "echo hi > new.txt") == created


def test_bash_edits_and_untracked_files_change_the_key(env, task):
    src = task.expert_edits[0]["path"]
    pristine = start(env)
    edited = bash_key(env, f"echo '# touched' >> {src}")
    assert edited != pristine
    assert bash_key(env, f"echo '# again' >> {src}") not in (pristine, edited)
    assert bash_key(env, f"git checkout -q -- {src}") == pristine, "undoing the edit gives the start key back"
    # an untracked file changes the key, and so does its content; a file git ignores does not
    untracked = bash_key(env, "echo a > scratch.txt")
    assert untracked != pristine
    other = bash_key(env, "echo b > scratch.txt")
    assert other not in (pristine, untracked)
    assert bash_key(env, "mkdir -p pkg/__pycache__ && echo x > pkg/__pycache__/m.pyc") == other
    # staging changes the index, a real difference in git's state; a mode change is one too
    staged = bash_key(env, "git add scratch.txt")
    assert staged != other
    moded = bash_key(env, f"chmod +x {src}")
    assert moded != staged
    # an untracked file sha256sum cannot read (a dangling symlink) still gives a key, and a new one
    assert bash_key(env, "ln -s nowhere dangling") not in (moded, staged)


def test_a_fork_has_its_parents_key_and_its_own_after_it_diverges(env, task):
    pristine = start(env)
    key = bash_key(env, "echo parent > p.txt")
    child = env.fork()
    try:
        assert child._state_key() == env._state_key() == key
        assert bash_key(child, "true") == key, "the fork's files are the parent's: a fresh digest agrees"
        diverged = bash_key(child, "rm p.txt")
        assert diverged not in (key,) and diverged == pristine
        assert bash_key(env, "true") == key, "the fork's step changed the parent's key"
    finally:
        child.close()


def test_a_container_that_cannot_be_keyed_gives_a_key_of_its_own_and_says_why(env, task):
    start(env)
    bash_key(env, "echo x > x.txt")
    fork = env.fork()
    try:
        docker_client().containers.get(fork._sb.name).kill()
        obs, reward, terminated, _, info = fork.step(call("bash", command="true"))  # no crash
        assert terminated and info["masked"] and info["state_key_error"]
        assert info["state_key"].startswith("unkeyed-") and info["state_key"] != env._state_key()
        # each failure is a key of its own: two dead branches never form a group
        dead = env.fork()
        docker_client().containers.get(dead._sb.name).kill()
        _, _, _, _, info2 = dead.step(call("file_editor", command="view", path="/testbed"))
        assert info2["state_key"].startswith("unkeyed-") and info2["state_key"] != info["state_key"]
        dead.close()
    finally:
        fork.close()
    assert "state_key_error" not in env.step(call("bash", command="true"))[4], "the parent is unharmed"


def test_a_repository_git_cannot_read_gives_a_key_of_its_own_and_the_episode_goes_on(env, task):
    start(env)
    fork = env.fork()
    try:
        obs, _, terminated, _, info = fork.step(call("bash", command="rm -rf .git"))
        assert "repository digest failed" in info["state_key_error"] and not terminated
        assert info["state_key"].startswith("unkeyed-") and not info.get("masked")
        _, _, _, _, again = fork.step(call("bash", command="true"))
        assert again["state_key"].startswith("unkeyed-") and again["state_key"] != info["state_key"]
    finally:
        fork.close()
