"""Smoke tests of the scripts in examples/: each runs as a user runs it (a subprocess, real envs,
real browsers / containers / vLLM where the family needs them) and its results are checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from turngym.rollout import load_trajectories

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(script: str, *args: str, cwd: Path, timeout: float = 900) -> tuple[int, str, dict]:
    """Run ``examples/<script>``; its exit code, output, and the JSON summary on its last line."""
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = out.stdout.strip().splitlines()
    summary = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
    return out.returncode, out.stdout + out.stderr[-3000:], summary


FAMILIES = [
    pytest.param("arith", id="arith"),
    pytest.param("search-qa", id="search-qa"),
    pytest.param("travel", id="travel"),
    pytest.param("travel-open", id="travel-open"),
    pytest.param("swe-docker", marks=[pytest.mark.docker, pytest.mark.slow], id="swe-docker"),
    pytest.param("web-miniwob", marks=[pytest.mark.browser, pytest.mark.slow], id="web-miniwob"),
    pytest.param("gui-miniwob", marks=[pytest.mark.browser, pytest.mark.slow], id="gui-miniwob"),
    pytest.param("gui-grounding", marks=[pytest.mark.browser, pytest.mark.slow], id="gui-grounding"),
    pytest.param("web-shop", marks=[pytest.mark.browser, pytest.mark.slow], id="web-shop"),
    pytest.param("gui-desktop", marks=[pytest.mark.docker, pytest.mark.slow], id="gui-desktop"),
    pytest.param("web-arena-lite", marks=[pytest.mark.browser, pytest.mark.slow], id="web-arena-lite"),
]


@pytest.mark.parametrize("family", FAMILIES)
def test_play_expert_solves_every_family(family, tmp_path):
    rc, out, summary = run_example("play_expert.py", family, "-n", "1", "--out", "t.jsonl", cwd=tmp_path)
    assert rc == 0, out
    assert summary["episodes"] == 1 and summary["masked"] == 0 and summary["terminated"] == 1, out
    trajs = load_trajectories(tmp_path / "t.jsonl")
    assert len(trajs) == 1 and trajs[0].num_turns == summary["mean_turns"]
    if family == "travel-open":  # no checkable answer: the outcome is neutral, the plan is still checked
        assert summary["mean_reward"] == 0.0
        assert trajs[0].turns[-1].reward_components["cs.complete_information"] == 1.0
    else:
        assert summary["solved"] == 1 and summary["mean_reward"] > 0, out


def test_play_expert_verbose_shows_every_turn(tmp_path):
    rc, out, summary = run_example("play_expert.py", "arith", "-n", "2", "--group", "2", "-v", cwd=tmp_path)
    assert rc == 0 and summary["episodes"] == 4 and summary["solved"] == 4
    turns = [line for line in out.splitlines() if line.startswith("  turn ")]
    assert len(turns) == 4 * summary["mean_turns"]
    assert out.count('"name": "answer"') == 4 and "{'correct': 1.0}" in out


def test_play_expert_unknown_family_is_a_clear_error(tmp_path):
    rc, out, _ = run_example("play_expert.py", "serch-qa", cwd=tmp_path)
    assert rc == 2 and "unknown env 'serch-qa'" in out and "search-qa" in out and "Traceback" not in out


METHODS = [
    pytest.param("grpo", id="grpo"),
    *(pytest.param(m, marks=pytest.mark.slow, id=m) for m in ("igpo", "gated", "arena", "gigpo", "turn")),
]


@pytest.mark.parametrize("method", METHODS)
def test_train_with_each_credit_method(method, tmp_path):
    rc, out, summary = run_example(
        "train_credit.py",
        "--method",
        method,
        "--steps",
        "1",
        "--run-dir",
        "run",
        "rollout.tasks_per_step=1",
        "rollout.group_size=3",
        "rollout.max_tokens=16",
        cwd=tmp_path,
    )
    assert rc == 0, out
    assert summary["method"] == method and summary["steps"] == 1 and "step 1:" in out
    run = tmp_path / "run"
    assert (run / "final").is_dir() and (run / "metrics.jsonl").exists()
    trajs = load_trajectories(run / "trajectories" / "step-000001.jsonl")
    assert len(trajs) == 3 and all(t.token_ids for t in trajs)
    # every turn of every trajectory carries this method's advantage (what `turngym view` shows)
    advantages = [turn.info["advantages"][method] for t in trajs for turn in t.turns]
    assert advantages and all(isinstance(a, float) for a in advantages)
    if method == "igpo":
        assert summary["credit_metrics"]["igpo/ig_fallback"] == 0.0  # arith's answer frame scored every turn


@pytest.mark.slow
@pytest.mark.vllm
def test_rollout_against_a_local_vllm_server(tmp_path, vllm_server):
    # the session's server; without --url the example starts its own VLLMServer, as the fixture does
    rc, out, summary = run_example(
        "rollout_vllm.py",
        "--url",
        vllm_server.url,
        "--tasks",
        "1",
        "--group",
        "2",
        "--max-turns",
        "2",
        "--out",
        "out",
        cwd=tmp_path,
    )
    assert rc == 0, out
    assert summary["trajectories"] == 2 and summary["turns"] >= 2 and summary["sampled_tokens"] > 0, out
    # a random-init model may write text that a chat template re-renders differently: that, and only
    # that, may mask a trajectory
    assert set(summary["mask_reasons"]) <= {"token_mismatch"}, out
    trajs = load_trajectories(tmp_path / "out" / "trajectories.parquet")
    assert len(trajs) == 2 and all(t.reference.get("answer") for t in trajs)
    for t in trajs:
        if not t.masked:
            assert len(t.token_ids) == len(t.loss_mask) == len(t.logprobs)
            a, b = t.turns[0].gen_span
            assert b > a and all(m == 1 for m in t.loss_mask[a:b])


def test_trl_grpo_example_trains_on_arith(tmp_path):
    pytest.importorskip("trl")
    rc, out, summary = run_example(
        "trl_grpo_arith.py", "--steps", "2", "--out", "run", cwd=tmp_path, timeout=600
    )
    assert rc == 0, out
    assert summary["steps"] == 2 and summary["tool_calls"] > 0 and summary["turngym_steps"] > 0, out
    assert -0.1 <= summary["mean_reward"] <= 1.0


@pytest.mark.slow
@pytest.mark.vllm
def test_verifiers_example_against_a_local_vllm_server(tmp_path, vllm_server):
    pytest.importorskip("verifiers")
    rc, out, summary = run_example(
        "verifiers_env.py",
        "--base-url",
        vllm_server.url + "/v1",
        "--tasks",
        "2",
        "--rollouts",
        "1",
        "--max-turns",
        "2",
        "--out",
        "vf",
        cwd=tmp_path,
    )
    assert rc == 0, out
    # the random model's replies are rarely tool calls: the env answers with error observations and
    # truncates; every episode still ends ok and is scored with the env's own reward
    assert summary["episodes"] == 2 and summary["ok"] == 2 and summary["scored"] == 2, out
    assert list((tmp_path / "vf").rglob("traces.jsonl"))
