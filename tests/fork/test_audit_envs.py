"""The credit audit on the heavy envs (slow): swe-docker against the real Docker daemon (the scripted
expert's trajectories, forks of the sandbox at a sampled turn, every continuation graded, no
container left) and web-shop in a real browser, from the command line."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from turngym.agents import ScriptedAgent
from turngym.sandboxes.docker import LABEL_PID, managed_containers
from turngym.trainer.audit import AuditConfig, run_audit

pytestmark = [pytest.mark.slow]


def mine() -> set[str]:
    return {c.name for c in managed_containers() if c.labels.get(LABEL_PID) == str(os.getpid())}


@pytest.mark.docker
def test_audit_forks_swe_docker_sandboxes_and_cleans_up():
    from turngym.envs.swe.tasks import load_instances
    from turngym.sandboxes.images import base_image

    base_image()
    task = next(t for t in load_instances() if t.package.startswith("inflection"))
    before = mine()
    cfg = AuditConfig(
        env="swe-docker",
        env_kwargs={"task_ids": [task.instance_id], "max_turns": 8, "max_active": 4, "command_timeout": 30},
        n=2,
        group_size=2,
        k=2,
        vine_k=0,
        turns="sample",
        sample_turns=1,
        max_turns=8,
        methods=("grpo", "gigpo"),
        bootstrap=10,
        seed=2,  # the sampled turn index is 0 (the expert submits at turn 1)
    )
    result = asyncio.run(run_audit(ScriptedAgent(), cfg))
    r = result.report
    vine = r["rollout"]["vine"]
    assert r["masked"] == 0 and vine.get("masked", 0) == 0 and vine.get("fork_errors", 0) == 0, vine
    assert r["config"]["vine_turns"] == (0,)
    assert r["rollout"]["vine"]["continuations"] == 2 * 2 * 2  # 2 trajectories x states 0 and 1 x k
    for t in result.trajectories:
        assert t.outcome == 1.0  # the expert fixes the bug
        audit = t.metadata["audit"]
        # a deterministic expert: every graded continuation ends like the episode, so A* = 0
        assert all(v == 1.0 for v, n in zip(audit["v"], [*audit["n"], 1], strict=True) if n)
        assert all(a in (None, 0.0) for a in audit["a_star"])
    assert r["scored_turns"] >= 1 and all("error" not in m for m in r["methods"].values())
    assert mine() == before  # every fork's container removed


@pytest.mark.browser
def test_audit_cli_on_web_shop_forks_browser_pages(tmp_path):
    from typer.testing import CliRunner

    from turngym.cli import app

    res = CliRunner().invoke(
        app,
        ["credit", "audit", "web-shop", "-b", "scripted", "-n", "1", "-g", "2", "--k", "2", "--vine-k", "0",
         "--turns", "sample", "--sample-turns", "1", "--seed", "2", "--method", "grpo", "--bootstrap", "5",
         "--out", str(tmp_path)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    r = json.loads((tmp_path / "audit.json").read_text())
    assert r["masked"] == 0 and r["success_rate"] == 1.0 and r["config"]["vine_turns"] == [0]
    assert (
        r["rollout"]["vine"]["continuations"] == 2 * 2 * 2 and r["rollout"]["vine"].get("fork_errors", 0) == 0
    )
    assert r["a_star"]["abs_mean"] == 0.0  # the expert's forks all succeed like the episode
