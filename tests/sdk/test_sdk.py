import os
import subprocess
import sys
from pathlib import Path

import pytest

import turngym
from turngym.sdk import ToolEnv
from turngym.sdk.check_path import load_envs_from_path
from turngym.sdk.scaffold import names_for, scaffold
from turngym.testing import check_env
from turngym.tools import tool


class Lookup(ToolEnv):
    tasks = [{"id": "a", "prompt": "say 1", "answer": "1"}, {"id": "b", "prompt": "say 2", "answer": "2"}]
    reward_components = ("correct",)
    default_max_turns = 3

    def start(self, task):
        self.said = None

    @tool(terminal=True)
    async def say(self, text: str) -> str:
        """Say the answer (async tool)."""
        self.said = text
        return "ok"

    def reward(self, task, done):
        return {"correct": float(self.said == task["answer"])} if done else {}

    def expert(self, task):
        return f'<tool_call>{{"name": "say", "arguments": {{"text": "{task["answer"]}"}}}}</tool_call>'


def test_tool_env_declarative_episode():
    env = Lookup()
    obs, info = env.reset(seed=0)
    assert info["reference"] == {"answer": env.task_dict["answer"]} and info["task_id"] in ("a", "b")
    assert obs[0].role == "system" and "say" in obs[0].content
    _, r, term, _, info = env.step(env.expert_action())
    assert term and r == 1.0
    obs, info = env.reset(options={"task": {"prompt": "say 3", "answer": "3"}})
    assert obs[1].content == "say 3" and len(info["task_id"]) == 12  # hashed id


def test_tool_env_conforms_and_validates():
    assert check_env(Lookup()).ok

    class Undeclared(Lookup):
        def reward(self, task, done):
            return {"surprise": 1.0}

    env = Undeclared()
    env.reset(seed=0)
    with pytest.raises(ValueError, match="undeclared"):
        env.step(env.expert_action())
    with pytest.raises(ValueError, match="'prompt'"):
        Lookup(tasks=[{"id": "x"}]).reset(seed=0)


def test_tool_env_tasks_from_jsonl(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"id": "j1", "prompt": "say 7", "answer": "7"}\n\n')
    env = Lookup(tasks=str(path))
    _, info = env.reset(seed=0)
    assert info["task_id"] == "j1"


def test_names_for():
    assert names_for("my-env") == {
        "name": "my-env",
        "dist": "turngym-my-env",
        "pkg": "turngym_my_env",
        "cls": "MyEnvEnv",
    }
    for bad in ("My_Env", "x-v1", "-x", ""):
        with pytest.raises(ValueError):
            names_for(bad)


@pytest.mark.slow
def test_scaffold_installs_and_its_tests_pass(tmp_path):
    """Generate a package, install it (a real pip install into a separate target), run its own tests."""
    root = scaffold("word-hunt", tmp_path / "word-hunt")
    with pytest.raises(FileExistsError):
        scaffold("word-hunt", root)
    target = tmp_path / "site"
    pip = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "--target",
        str(target),
        str(root),
    ]
    subprocess.run(pip, check=True, capture_output=True, text=True)
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(root / "tests")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "4 passed" in out.stdout
    out = subprocess.run(
        [sys.executable, "-m", "turngym.cli", "check", "word-hunt", "--json"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert '"ok": true' in out.stdout


def test_check_path_file_and_package(tmp_path):
    example = Path(__file__).resolve().parents[2] / "examples" / "custom_env.py"
    found = load_envs_from_path(example)
    assert [type(e).__name__ for e in found] == ["GuessNumberEnv"]
    root = scaffold("path-check", tmp_path / "pc")
    ids = load_envs_from_path(root)
    assert ids == ["path-check-v0"]
    turngym.registry.unregister("path-check-v0")
    with pytest.raises(FileNotFoundError):
        load_envs_from_path(tmp_path / "missing.py")


def test_check_cli_names_each_failure_last_on_stderr(tmp_path):
    """A failing `turngym check` ends with one line per failed check, so a long run's tail says what failed."""
    env_file = tmp_path / "coin_env.py"
    env_file.write_text(
        "import os\n"
        "from turngym.sdk import ToolEnv\n"
        "from turngym.tools import tool\n\n"
        "class Coin(ToolEnv):\n"
        "    tasks = [{'id': 'a', 'prompt': 'say 1', 'answer': '1'}]\n"
        "    reward_components = ('correct',)\n\n"
        "    @tool(terminal=True)\n"
        "    def say(self, text: str) -> str:\n"
        "        '''Say the answer.'''\n"
        "        return os.urandom(8).hex()  # a different observation every time: not deterministic\n\n"
        "    def reward(self, task, done):\n"
        "        return {'correct': 0.0}\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "turngym.cli", "check", str(env_file)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-2:] == [
        "FAIL Coin determinism: AssertionError: seed 0: first-step observations differ",
        "FAIL Coin gymnasium: AssertionError: Deterministic step observations are not equivalent for the same "
        "seed and action",
    ]
    assert "Coin: FAIL" in out.stdout


def test_check_cli_skip_extra_leaves_out_the_envs_needing_it():
    """`turngym check` with no targets checks every registered env but those needing a skipped extra:
    each of those is named as skipped, never made (no browser, container or server starts)."""
    extras = ("web", "interop", "search", "docker", "travel", "desktop")
    skipped = [s.id for s in turngym.registry.latest() if set(s.requires) & set(extras)]
    assert "gui-desktop-v0" in skipped and "arith-v0" not in skipped
    args = [arg for extra in extras for arg in ("--skip-extra", extra)]
    out = subprocess.run(
        [sys.executable, "-m", "turngym.cli", "check", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    for env_id in skipped:
        assert f"{env_id}: skipped (--skip-extra" in out.stdout
        assert f"{env_id}: PASS" not in out.stdout and f"{env_id}: FAIL" not in out.stdout
    assert "arith-v0: PASS" in out.stdout  # an env needing no skipped extra is still checked
    spec = turngym.registry.latest()[[s.id for s in turngym.registry.latest()].index("gui-desktop-v0")]
    assert f"gui-desktop-v0: skipped (--skip-extra {', '.join(sorted(spec.requires))})" in out.stdout
