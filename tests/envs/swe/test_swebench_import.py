"""SWE-bench instances from a JSON/JSONL file plus a real local git checkout, imported with
``turngym swe import-swebench`` and graded in Docker as SWE-bench grades them.

The repository (made here with git) has the bug at commit A; commit B fixes it and adds the test
that shows it. The instance names A; ``patch`` and ``test_patch`` are ``git diff A B`` of the source
and of the tests, as SWE-bench builds them. The checkout stays at B (past ``base_commit``).
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
from typer.testing import CliRunner

from turngym.cli import app
from turngym.envs.swe.mutations import unified_patch
from turngym.envs.swe.tasks import InstanceError, check_instance, load_instances

BUGGY = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"
FIXED = BUGGY.replace("return a - b\n\n\ndef sub", "return a + b\n\n\ndef sub")
TEST_OTHER = "from calc import sub\n\n\ndef test_sub():\n    assert sub(5, 3) == 2\n\n\ndef test_truth():\n    assert True\n"
TEST_ADD = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\ndef test_add_zero():\n    assert add(0, 0) == 0\n"
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@localhost",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@localhost",
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(repo, *args: str) -> str:
    res = subprocess.run(
        ["git", "-C", str(repo), *args],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **_GIT_ENV},
    )
    return res.stdout


@pytest.fixture
def swebench_repo(tmp_path):
    """(checkout at B, commit A, the instance dict naming A)."""
    repo = tmp_path / "calc-repo"
    (repo / "calc").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "calc" / "__init__.py").write_text(BUGGY)
    (repo / "tests" / "test_other.py").write_text(TEST_OTHER)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "A")
    a = git(repo, "rev-parse", "HEAD").strip()
    (repo / "calc" / "__init__.py").write_text(FIXED)
    (repo / "tests" / "test_add.py").write_text(TEST_ADD)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "B: fix add, test it")
    inst = {  # the swebench package's SWEbenchInstance fields
        "repo": "demo/calc",
        "instance_id": "demo__calc-7",
        "base_commit": a,
        "patch": git(repo, "diff", a, "HEAD", "--", "calc"),
        "test_patch": git(repo, "diff", a, "HEAD", "--", "tests"),
        "problem_statement": "calc.add(2, 3) returns -1 instead of 5",
        "hints_text": "",
        "created_at": "2026-01-01T00:00:00Z",
        "version": "0.1",
        "FAIL_TO_PASS": json.dumps(["tests/test_add.py::test_add"]),
        "PASS_TO_PASS": json.dumps(
            [
                "tests/test_add.py::test_add_zero",
                "tests/test_other.py::test_sub",
                "tests/test_other.py::test_truth",
            ]
        ),
        "environment_setup_commit": a,
    }
    return repo, a, inst


def write_jsonl(path, *instances):
    path.write_text("".join(json.dumps(i) + "\n" for i in instances))
    return path


# ---------------------------------------------------------------- import (no Docker)
def test_import_swebench_writes_a_task_file_that_needs_no_snapshot(swebench_repo, tmp_path):
    repo, a, inst = swebench_repo
    src = write_jsonl(tmp_path / "instances.jsonl", inst)
    out = tmp_path / "tasks.json"
    res = CliRunner().invoke(
        app, ["swe", "import-swebench", str(src), "--repo", str(repo), "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    assert f"demo__calc-7: base_commit {a[:12]}, 1 FAIL_TO_PASS, 3 PASS_TO_PASS" in res.output
    (task,) = load_instances(out)  # the file remembers the checkout and the commit
    assert task.graded_commit == a and task.grader == "swebench"
    assert task.files()["calc/__init__.py"].decode() == BUGGY
    assert check_instance(task) == []
    assert git(repo, "status", "--porcelain") == ""  # the checkout was never touched


def test_import_swebench_reports_a_patch_that_does_not_apply(swebench_repo, tmp_path):
    repo, _, inst = swebench_repo
    bad = inst | {
        "instance_id": "demo__calc-8",
        "patch": inst["patch"].replace("-    return a - b", "-    return a * b", 1),
    }
    src = write_jsonl(tmp_path / "instances.jsonl", inst, bad)
    res = CliRunner().invoke(app, ["swe", "import-swebench", str(src), "--repo", str(repo)])
    assert res.exit_code == 1
    assert "instance demo__calc-8: field patch does not apply" in res.output
    assert "demo__calc-7" not in res.output.split("problem(s)")[0]  # the good one has no problem
    assert not (tmp_path / "instances.turngym.json").exists()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"FAIL_TO_PASS": None}, r"instance demo__calc-7: missing field\(s\) FAIL_TO_PASS"),
        (
            {"FAIL_TO_PASS": "tests/test_add.py::test_add"},
            r"demo__calc-7: field FAIL_TO_PASS is a string but not a JSON list",
        ),
        ({"PASS_TO_PASS": {"t": 1}}, r"demo__calc-7: field PASS_TO_PASS must be a list of test ids"),
        ({"PASS_TO_PASS": "[1, 2]"}, r"demo__calc-7: field PASS_TO_PASS must be a list of test ids"),
        ({"FAIL_TO_PASS": "[]"}, r"demo__calc-7: FAIL_TO_PASS is empty"),
        ({"patch": 3}, r"demo__calc-7: field patch must be a string"),
        ({"base_commit": "f" * 40}, r"demo__calc-7: base_commit f{40} is not a commit of the git snapshot"),
    ],
)
def test_malformed_instances_name_the_instance_and_field(swebench_repo, tmp_path, edit, message):
    repo, _, inst = swebench_repo
    src = write_jsonl(tmp_path / "instances.jsonl", {k: v for k, v in (inst | edit).items() if v is not None})
    with pytest.raises(InstanceError, match=message) as err:
        load_instances(src, snapshot=str(repo))
    assert "instances.jsonl line 1" in str(err.value)
    res = CliRunner().invoke(app, ["swe", "import-swebench", str(src), "--repo", str(repo)])
    assert res.exit_code == 2 and "demo__calc-7" in res.output


def test_bad_json_names_the_file_and_line(tmp_path, swebench_repo):
    repo, _, inst = swebench_repo
    jl = tmp_path / "i.jsonl"
    jl.write_text(json.dumps(inst) + "\n{'instance_id': 'x'}\n")
    with pytest.raises(InstanceError, match=r"i.jsonl line 2: not valid JSON \(Expecting property name"):
        load_instances(jl, snapshot=str(repo))
    js = tmp_path / "i.json"
    js.write_text(json.dumps(inst) + "\n" + json.dumps(inst) + "\n")
    with pytest.raises(InstanceError, match=r"i.json: not valid JSON \(Extra data at line 2.*a JSONL file\?"):
        load_instances(js, snapshot=str(repo))
    js.write_text("[3]")
    with pytest.raises(InstanceError, match="i.json entry 0: a SWE-bench instance must be a JSON object"):
        load_instances(js, snapshot=str(repo))


# ---------------------------------------------------------------- graded in Docker
def _mine() -> list:
    from turngym.sandboxes.docker import LABEL_PID, managed_containers

    return [c for c in managed_containers() if c.labels.get(LABEL_PID) == str(os.getpid())]


def _wait_none_of_mine(before: set[str], timeout: float = 60.0) -> set[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = {c.name for c in _mine()} - before
        if not left:
            return left
        time.sleep(0.2)
    return left


@pytest.mark.docker
async def test_swebench_instance_is_graded_as_swebench_grades(swebench_repo, tmp_path, base_image):
    from turngym.envs.swe.env import SweDockerEnv
    from turngym.envs.swe.validate import expert_episode

    repo, a, inst = swebench_repo
    out = tmp_path / "tasks.json"
    res = CliRunner().invoke(
        app,
        [
            "swe",
            "import-swebench",
            str(write_jsonl(tmp_path / "i.jsonl", inst)),
            "--repo",
            str(repo),
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    before = {c.name for c in _mine()}
    env = SweDockerEnv(str(out), base_image=base_image, max_turns=4)
    try:
        gold = await env.agrade(inst["patch"], "demo__calc-7")
        assert gold.resolved and gold.status == "RESOLVED_FULL" and gold.grader == "swebench"
        assert (gold.f2p_passed, gold.p2p_passed) == (1, 3)

        empty = await env.agrade("", "demo__calc-7")  # test_patch is applied at grading: test_add fails
        assert not empty.resolved and empty.status == "RESOLVED_NO"
        assert (empty.f2p_passed, empty.p2p_passed) == (0, 3) and empty.failing == [
            "tests/test_add.py::test_add"
        ]

        # fixes add but breaks sub, which a PASS_TO_PASS test checks
        breaking = FIXED.replace("def sub(a, b):\n    return a - b", "def sub(a, b):\n    return b - a")
        grade = await env.agrade(unified_patch("calc/__init__.py", BUGGY, breaking), "demo__calc-7")
        assert grade.status == "RESOLVED_NO" and not grade.resolved
        assert (grade.f2p_passed, grade.p2p_passed) == (1, 2) and grade.failing == [
            "tests/test_other.py::test_sub"
        ]
        assert grade.components() == {"fail_to_pass": 1.0, "pass_to_pass": 2 / 3}

        # an episode: the gold-patch expert applies `patch` through bash, then submits
        reward, info = await expert_episode(env, "demo__calc-7")
        assert reward == 1.0, info.get("grade")
        assert info["reward_components"]["fail_to_pass"] == 1.0
        assert info["reward_components"]["pass_to_pass"] == 1.0
        assert info["grade"]["status"] == "RESOLVED_FULL"
        assert info["reference"]["graded_commit"] == a
    finally:
        await env.aclose()
    assert _wait_none_of_mine(before) == set()
