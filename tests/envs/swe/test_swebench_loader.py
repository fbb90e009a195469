"""A plain SWE-bench instance plus a user-supplied repository snapshot runs end to end in Docker."""

from __future__ import annotations

import json
import subprocess

import pytest

import turngym
from turngym.envs.swe.mutations import unified_patch

pytestmark = [pytest.mark.docker, pytest.mark.slow]

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TEST_PATCH_TEST = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\ndef test_zero():\n    assert add(0, 0) == 0\n"


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture
def instance(tmp_path):
    snap = tmp_path / "snapshot"
    (snap / "src" / "calc").mkdir(parents=True)
    (snap / "src" / "calc" / "__init__.py").write_text(BUGGY)
    (snap / "tests").mkdir()
    (snap / "tests" / "test_other.py").write_text("def test_other():\n    assert True\n")
    test_patch = subprocess.run(  # the upstream test change, as `git diff` writes a new file
        [
            "bash",
            "-c",
            f"cd {tmp_path} && mkdir -p b/tests && cat > b/tests/test_calc.py && "
            "git diff --no-index /dev/null b/tests/test_calc.py | sed 's#b/b/#b/#; s#a/dev/null#/dev/null#'",
        ],
        input=TEST_PATCH_TEST,
        capture_output=True,
        text=True,
    ).stdout
    inst = {
        "instance_id": "demo__calc-1",
        "repo": "demo/calc",
        "base_commit": "0" * 40,
        "patch": unified_patch("src/calc/__init__.py", BUGGY, FIXED),
        "test_patch": test_patch,
        "problem_statement": "add(2, 3) returns -1",
        "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_add"]),
        "PASS_TO_PASS": json.dumps(["tests/test_calc.py::test_zero", "tests/test_other.py::test_other"]),
    }
    path = tmp_path / "instances.json"
    path.write_text(json.dumps([inst]))
    return path, snap, inst


def test_swebench_instance_with_snapshot(instance):
    path, snap, inst = instance
    env = turngym.make(
        "swe-docker-v0", tasks=str(path), snapshot=str(snap), src_root="src", allow_unpinned=True, max_turns=6
    )
    try:
        obs, info = env.reset(seed=0)
        assert "add(2, 3) returns -1" in obs[1].content
        # the hidden test file of test_patch is not in the agent's repository
        o, *_ = env.step(call("bash", command="ls tests; python3 -c 'import calc; print(calc.add(2, 3))'"))
        assert "test_calc.py" not in o[0].content and "-1" in o[0].content
        _, reward, _, _, info = env.step(call("submit"))
        assert reward == 0.0 and info["reward_components"]["outcome_level"] == 1.0

        env.reset(seed=0)
        env.step(
            call(
                "file_editor",
                command="str_replace",
                path="/testbed/src/calc/__init__.py",
                old_str="a - b",
                new_str="a + b",
            )
        )
        _, reward, terminated, _, info = env.step(call("submit"))
        assert terminated and reward == 1.0, info.get("grade")
        assert info["grade"]["FAIL_TO_PASS"] == "1/1" and info["grade"]["PASS_TO_PASS"] == "2/2"
    finally:
        env.close()
