"""Harbor tasks (task.toml, instruction.md, environment/Dockerfile, tests/test.sh, solution/solve.sh)
load as swe-docker tasks: the image builds from turngym's local base, the verifier grades in a fresh
container, and malformed tasks say what is missing."""

from __future__ import annotations

import json
import os
import time

import pytest

from turngym.envs.swe.harbor import HarborTaskError, from_images, load_harbor_task, read_task_toml
from turngym.envs.swe.repo import read_reward

TASK_TOML = """version = "1.0"

[task]
name = "demo/greet"

[metadata]
difficulty = "easy"
category = "programming"

[verifier]
timeout_sec = 60.0
env = { EXPECTED = "hello, world" }

[agent]
timeout_sec = 120.0

[environment]
build_timeout_sec = 300.0
cpus = 1
memory_mb = 1024
"""
DOCKERFILE = "ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nWORKDIR /app\nCOPY greet.py /app/greet.py\n"
TEST_SH = """#!/bin/bash
# reward 1 when greet.py prints $EXPECTED; a helper file of tests/ decides
python3 /tests/check.py "$(python3 /app/greet.py)" > /logs/verifier/reward.txt
"""
CHECK_PY = "import os, sys\nprint(1 if sys.argv[1] == os.environ['EXPECTED'] else 0)\n"


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def make_task(root, *, dockerfile=DOCKERFILE, toml=TASK_TOML, instruction=True, tests=True, solution=True):
    d = root / "greet"
    (d / "environment").mkdir(parents=True)
    (d / "task.toml").write_text(toml)
    if instruction:
        (d / "instruction.md").write_text("`python3 greet.py` prints `helo`; make it print `hello, world`.\n")
    if dockerfile is not None:
        (d / "environment" / "Dockerfile").write_text(dockerfile)
    (d / "environment" / "greet.py").write_text('print("helo")\n')
    if tests:
        (d / "tests").mkdir()
        (d / "tests" / "test.sh").write_text(TEST_SH)
        (d / "tests" / "check.py").write_text(CHECK_PY)
    if solution:
        (d / "solution").mkdir()
        (d / "solution" / "solve.sh").write_text("printf 'print(\"hello, world\")\\n' > greet.py\n")
    return d


# ---------------------------------------------------------------- parsing (no Docker)
def test_from_images_substitutes_args_and_skips_stages():
    text = "ARG BASE_IMAGE\nARG PY=python:3.11\nFROM ${BASE_IMAGE} AS build\nFROM $PY\nFROM build\nFROM scratch\n"
    assert from_images(text, {"BASE_IMAGE": "turngym-base:x"}) == ["turngym-base:x", "python:3.11"]
    assert from_images("FROM --platform=linux/amd64 ubuntu:24.04\n", {}) == ["ubuntu:24.04"]


@pytest.mark.parametrize(
    ("text", "name", "value"),
    [
        ("1\n", "reward.txt", 1.0),
        ("0.25", "reward.txt", 0.25),
        ('{"reward": 0.5}', "reward.json", 0.5),
        ('{"acc": 1}', "reward.json", 1.0),
    ],
)
def test_read_reward(text, name, value):
    assert read_reward(text, name) == value


@pytest.mark.parametrize(
    ("text", "name"), [("yes", "reward.txt"), ('{"a": 1, "b": 2}', "reward.json"), ("[1]", "reward.json")]
)
def test_read_reward_rejects_what_is_not_one_number(text, name):
    with pytest.raises(ValueError):
        read_reward(text, name)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"instruction": False}, r"Harbor task demo/greet: instruction.md is missing"),
        ({"tests": False}, r"Harbor task demo/greet: tests/test.sh is missing"),
        ({"toml": "[verifier\ntimeout_sec = 1"}, r"Harbor task greet: task.toml is not valid TOML"),
        (
            {"toml": TASK_TOML.replace("timeout_sec = 60.0", 'timeout_sec = "soon"')},
            r"verifier.timeout_sec must be a positive number",
        ),
        (
            {"toml": TASK_TOML.replace('env = { EXPECTED = "hello, world" }', "env = 3")},
            r"verifier.env must be a table",
        ),
    ],
)
def test_malformed_harbor_task_says_what_is_missing(tmp_path, kwargs, message):
    d = make_task(tmp_path, **kwargs)
    with pytest.raises(HarborTaskError, match=message):
        load_harbor_task(d)


def test_task_toml_is_read_with_tomllib(tmp_path):
    config = read_task_toml(make_task(tmp_path))
    assert config["task"]["name"] == "demo/greet" and config["verifier"]["env"] == {
        "EXPECTED": "hello, world"
    }


# ---------------------------------------------------------------- Docker
def _mine() -> set[str]:
    from turngym.sandboxes.docker import LABEL_PID, managed_containers

    return {c.name for c in managed_containers() if c.labels.get(LABEL_PID) == str(os.getpid())}


def _settled(before: set[str], timeout: float = 60.0) -> set[str]:
    deadline = time.monotonic() + timeout
    while (left := _mine() - before) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.mark.docker
@pytest.mark.parametrize(
    ("dockerfile", "message"),
    [
        (
            "FROM turngym-no-such-image:1\nWORKDIR /app\n",
            r"demo/greet: environment/Dockerfile builds FROM turngym-no-such-image:1, which is not a local",
        ),
        (
            None,
            r"demo/greet: environment/Dockerfile is missing and task.toml names no environment.docker_image",
        ),
        ("ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nWORKDIR /\n", r"demo/greet: the image sets no WORKDIR"),
        (
            "ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nRUN exit 3\n",
            r"demo/greet: environment/Dockerfile does not build",
        ),
    ],
)
def test_harbor_image_problems_are_named(tmp_path, base_image, dockerfile, message):
    before = _mine()
    d = make_task(tmp_path, dockerfile=dockerfile)
    with pytest.raises(HarborTaskError, match=message):
        load_harbor_task(d, base_image=base_image)
    assert _settled(before) == set()


@pytest.mark.docker
def test_harbor_task_runs_in_swe_docker(tmp_path, base_image):
    import turngym

    before = _mine()
    make_task(tmp_path)
    env = turngym.make("swe-docker-v0", tasks=str(tmp_path), base_image=base_image, max_turns=4)
    try:
        (task,) = env.tasks
        assert task.instance_id == "demo/greet" and task.grader == "harbor"
        assert task.harbor["workdir"] == "/app" and task.files() == {"greet.py": b'print("helo")\n'}
        assert task.harbor["verifier_timeout"] == 60.0 and task.harbor["metadata"]["difficulty"] == "easy"

        obs, info = env.reset(options={"task_id": "demo/greet"})
        assert "make it print `hello, world`" in obs[1].content and "/app" in obs[1].content
        o, *_ = env.step(call("bash", command="cd /app && python3 greet.py && ls /tests 2>&1 | head -1"))
        assert "helo" in o[0].content and "check.py" not in o[0].content  # the verifier is not there yet
        # a wrong fix plus a planted reward file: grading runs test.sh in a fresh container
        env.step(call("bash", command="mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt"))
        env.step(
            call("file_editor", command="str_replace", path="/app/greet.py", old_str="helo", new_str="hello")
        )
        _, reward, terminated, _, info = env.step(call("submit"))
        assert terminated and reward == 0.0, info.get("grade")
        assert info["grade"]["score"] == 0.0 and info["grade"]["status"] == "RESOLVED_NO"
        assert info["reward_components"]["outcome_level"] == 2.0

        env.reset(options={"task_id": "demo/greet"})  # no change at all: not graded
        _, reward, terminated, _, info = env.step(call("submit"))
        assert reward == 0.0 and info["reward_components"]["outcome_level"] == 1.0

        env.reset(options={"task_id": "demo/greet"})  # the expert runs solution/solve.sh, then submits
        terminated = truncated = False
        while not (terminated or truncated):
            _, reward, terminated, truncated, info = env.step(env.expert_action())
        assert reward == 1.0 and info["grade"]["status"] == "RESOLVED_FULL", info.get("grade")
    finally:
        env.close()
    assert _settled(before) == set()


@pytest.mark.docker
def test_validate_cli_runs_the_harbor_solution(tmp_path, base_image):
    from typer.testing import CliRunner

    from turngym.cli import app

    before = _mine()
    d = make_task(tmp_path)
    args = ["swe", "validate", "--tasks", str(d), "--base-image", base_image, "--concurrency", "1"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "1/1 tasks resolved by the expert" in res.output
    (d / "solution" / "solve.sh").write_text("printf 'print(\"hello\")\\n' > greet.py\n")  # a wrong solution
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 1 and "FAILED demo/greet: gold patch reward 0.0" in res.output
    assert _settled(before) == set()
