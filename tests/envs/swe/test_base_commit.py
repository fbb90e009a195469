"""A SWE-bench instance's ``base_commit`` decides what is graded when the snapshot is a git checkout.

The repository here has the bug at commit A and the fix at commit B; the checkout sits at B (the fix
already committed) while the instance names A. Grading B would pay a trivial edit 1.0.
"""

from __future__ import annotations

import json
import os
import subprocess
import warnings

import pytest

import turngym
from turngym.envs.swe.mutations import unified_patch
from turngym.envs.swe.tasks import load_instances

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TEST_CALC = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\ndef test_zero():\n    assert add(0, 0) == 0\n"
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@localhost",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@localhost",
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(repo, *args: str) -> str:
    env = {**os.environ, **_GIT_ENV}
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env
    ).stdout.strip()


def new_file_patch(path: str, text: str) -> str:
    lines = text.splitlines(keepends=True)
    return (
        f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
        f"@@ -0,0 +1,{len(lines)} @@\n" + "".join("+" + line for line in lines)
    )


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture
def repo_past_base(tmp_path):
    """(checkout at the fix B, commit A with the bug, commit B, instance file naming A)."""
    repo = tmp_path / "checkout"
    (repo / "calc").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "calc" / "__init__.py").write_text(BUGGY)
    (repo / "tests" / "test_other.py").write_text("def test_other():\n    assert True\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "A: the bug")
    a = git(repo, "rev-parse", "HEAD")
    (repo / "calc" / "__init__.py").write_text(FIXED)
    git(repo, "commit", "-q", "-am", "B: the fix")
    b = git(repo, "rev-parse", "HEAD")
    inst = {
        "instance_id": "demo__calc-2",
        "repo": "demo/calc",
        "base_commit": a,
        "patch": unified_patch("calc/__init__.py", BUGGY, FIXED),
        "test_patch": new_file_patch("tests/test_calc.py", TEST_CALC),
        "problem_statement": "add(2, 3) returns -1",
        "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_add"]),
        "PASS_TO_PASS": json.dumps(["tests/test_calc.py::test_zero", "tests/test_other.py::test_other"]),
    }
    path = tmp_path / "instances.json"
    path.write_text(json.dumps([inst]))
    return repo, a, b, path


# ---------------------------------------------------------------- loader (no Docker)
def test_git_snapshot_is_read_at_base_commit_without_touching_the_checkout(repo_past_base):
    repo, a, b, path = repo_past_base
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (task,) = load_instances(path, snapshot=str(repo))
    assert task.graded_commit == a
    files = task.files()
    assert files["calc/__init__.py"].decode() == BUGGY
    assert set(files) == {"calc/__init__.py", "tests/test_other.py"}
    # the user's checkout is unchanged: still at B, clean, the fix in place
    assert git(repo, "rev-parse", "HEAD") == b
    assert git(repo, "status", "--porcelain") == ""
    assert (repo / "calc" / "__init__.py").read_text() == FIXED


def test_short_base_commit_is_resolved_to_the_full_id(repo_past_base):
    repo, a, _, path = repo_past_base
    inst = json.loads(path.read_text())[0] | {"base_commit": a[:10]}
    (task,) = load_instances(_write(path, inst), snapshot=str(repo))
    assert task.graded_commit == a


def test_base_commit_missing_from_the_git_snapshot_is_an_error(repo_past_base):
    repo, _, _, path = repo_past_base
    inst = json.loads(path.read_text())[0] | {"base_commit": "1234567" * 5 + "89ab0"}
    with pytest.raises(ValueError, match=r"demo__calc-2: base_commit 1234567\w+ is not a commit of the git"):
        load_instances(_write(path, inst), snapshot=str(repo))


def test_snapshot_that_is_not_a_git_checkout_is_refused_unless_opted_out(repo_past_base, tmp_path):
    _, a, _, path = repo_past_base
    plain = tmp_path / "plain"
    (plain / "calc").mkdir(parents=True)
    (plain / "calc" / "__init__.py").write_text(BUGGY)
    with pytest.raises(
        ValueError, match=f"demo__calc-2: names base_commit {a}, but the snapshot .* is not a git"
    ):
        load_instances(path, snapshot=str(plain))
    with pytest.warns(UserWarning, match="not a git checkout, so it cannot be checked out at"):
        (task,) = load_instances(path, snapshot=str(plain), allow_unpinned=True)
    assert task.graded_commit is None and task.files() == {"calc/__init__.py": BUGGY.encode()}


def test_git_snapshot_without_base_commit_uses_the_working_tree(repo_past_base):
    repo, _, _, path = repo_past_base
    inst = json.loads(path.read_text())[0] | {"base_commit": ""}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (task,) = load_instances(_write(path, inst), snapshot=str(repo))
    assert task.graded_commit is None and task.files()["calc/__init__.py"].decode() == FIXED


def test_gold_patch_command_applies_the_patch_in_bash(repo_past_base, tmp_path):
    from turngym.envs.swe.tools import apply_command as _apply_command

    repo, a, _, path = repo_past_base
    work = tmp_path / "work"
    git(tmp_path, "clone", "-q", str(repo), str(work))
    git(work, "checkout", "-q", a)
    patch = json.loads(path.read_text())[0]["patch"]
    patch = patch.replace("def add(a, b):", "def add(a, b):  # TURNGYM_PATCH_EOF")  # a line like the marker
    (work / "calc" / "__init__.py").write_text("def add(a, b):  # TURNGYM_PATCH_EOF\n    return a - b\n")
    command = _apply_command(patch)
    subprocess.run(["bash", "-c", command], cwd=work, check=True)
    assert (work / "calc" / "__init__.py").read_text().endswith("return a + b\n")


def _write(path, inst):
    out = path.with_name("edited.json")
    out.write_text(json.dumps([inst]))
    return out


# ---------------------------------------------------------------- graded in Docker
@pytest.mark.docker
@pytest.mark.slow
def test_checkout_past_base_commit_is_graded_at_base_commit(repo_past_base):
    repo, a, _, path = repo_past_base
    env = turngym.make("swe-docker-v0", tasks=str(path), snapshot=str(repo), max_turns=5)
    try:
        env.reset(seed=0)
        env.step(call("bash", command="echo '# a trivial edit' >> calc/__init__.py"))
        _, reward, terminated, _, info = env.step(call("submit"))
        assert terminated and reward == 0.0, info.get("grade")
        assert info["reward_components"]["outcome_level"] == 2.0

        env.reset(seed=0)
        o, *_ = env.step(call("bash", command="python3 -c 'import calc; print(calc.add(2, 3))'"))
        assert "-1" in o[0].content  # the agent sees the bug of commit A, not B's fix
        gold = json.loads(path.read_text())[0]["patch"]
        o, *_ = env.step(call("bash", command=f"git apply - <<'EOF'\n{gold}EOF"))
        assert "<returncode>0</returncode>" in o[0].content, o[0].content
        _, reward, terminated, _, info = env.step(call("submit"))
        assert terminated and reward == 1.0, info.get("grade")
        assert info["grade"]["FAIL_TO_PASS"] == "1/1" and info["grade"]["PASS_TO_PASS"] == "2/2"
        assert info["reference"]["graded_commit"] == a  # which commit was graded is recorded
        assert info["grade"]["status"] == "RESOLVED_FULL" and info["grade"]["grader"] == "swebench"
        assert info["reward_components"]["fail_to_pass"] == 1.0
    finally:
        env.close()


@pytest.mark.docker
@pytest.mark.slow
def test_validate_cli_resolves_a_loaded_instance_with_its_gold_patch(repo_past_base):
    from typer.testing import CliRunner

    from turngym.cli import app

    repo, _, _, path = repo_past_base
    args = ["swe", "validate", "--tasks", str(path), "--snapshot", str(repo), "--concurrency", "1"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "1/1 tasks resolved by the expert" in res.output
