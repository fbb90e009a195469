"""Agent frameworks from the package index, unmodified, through the proxy: each plays ``arith`` to the
env's own return with the scripted expert as the model, and with the tiny model (CPU) runs and records.

* the ``openai`` SDK tool loop (turngym's environment; tools over the proxy's MCP door);
* the OpenAI Agents SDK (``openai-agents``: its pins clash with turngym's, so it lives in a virtual
  environment of its own: ``$TURNGYM_OPENAI_AGENTS_PYTHON``, else ``.venv-harness/openai-agents`` of the
  checkout (scripts/setup.sh makes it), else ``/work/venvs/openai-agents``; skipped when none exists);
* smolagents (``turngym[harness]``): tools run a local env, the reward is posted to the proxy.

The drift each framework causes is asserted: the two OpenAI ones send the model's replies back as
returned (one segment per episode); smolagents rewrites each reply as ``Calling tools: [...]`` text, so
every call starts a new segment (``reply_changed``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.proxy.helpers import env_return, run

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "harness"


def _agents_python() -> str | None:
    for candidate in (
        os.environ.get("TURNGYM_OPENAI_AGENTS_PYTHON"),
        str(ROOT / ".venv-harness" / "openai-agents" / "bin" / "python"),
        "/work/venvs/openai-agents/bin/python",
    ):
        if candidate and Path(candidate).exists():
            return candidate
    return None


def _command(framework: str, model: str) -> str:
    if framework == "openai_sdk":
        return f"{sys.executable} {EXAMPLES}/openai_tool_loop.py --model {model} --task {{task}}"
    if framework == "openai_agents":
        python = _agents_python()
        if python is None:
            pytest.skip(
                "openai-agents has no virtual environment here (scripts/setup.sh makes .venv-harness)"
            )
        return f"{python} {EXAMPLES}/openai_agents_arith.py --model {model} --task {{task}}"
    pytest.importorskip("smolagents", reason="smolagents is not installed (turngym[harness])")
    return f"{sys.executable} {EXAMPLES}/smolagents_arith.py --model {model} --task {{task}}"


FRAMEWORKS = ["openai_sdk", "openai_agents", "smolagents"]


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_framework_plays_arith_to_the_envs_return(expert_proxy, framework):
    (t,) = run(expert_proxy, _command(framework, "expert"), ["3"], mcp=framework != "smolagents")
    ret, _, turns = env_return(3)
    assert not t.masked, (t.mask_reason, t.metadata["harness"]["stderr_tail"])
    assert t.total_reward == ret == 1.0
    tools = [c.name for turn in t.turns for c in turn.action.tool_calls]
    assert tools[:turns] == ["calculate"] * (turns - 1) + ["answer"]
    # every call's sampled ids carry the loss; nothing else does
    assert sum(t.loss_mask) == sum(e - s for s, e in (turn.gen_span for turn in t.turns))
    if framework == "smolagents":
        assert t.metrics["segments"] == len(t.turns) > 1
        assert {d["reason"] for d in t.metadata["drifts"]} == {"reply_changed"}
    else:
        assert t.metrics["segments"] == 1 and t.metrics["drift"] == 0


@pytest.fixture(scope="module")
def tiny_proxy(hf_backend, tokenizer):
    from tests.proxy.conftest import TOKEN
    from turngym.proxy import make_proxy, serve_proxy

    proxy = make_proxy(backend=hf_backend, tokenizer=tokenizer, name="tiny", max_context=4096, max_tokens=24)
    with serve_proxy(proxy, token=TOKEN, envs=["arith"], env_kwargs={"tools_in_prompt": False}) as r:
        yield r


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_framework_runs_on_the_tiny_model_and_every_call_is_recorded(tiny_proxy, framework):
    (t,) = run(
        tiny_proxy, _command(framework, "tiny"), ["3"], mcp=framework != "smolagents", reward_timeout_s=2
    )
    assert t.turns, (t.mask_reason, t.metadata["harness"]["stderr_tail"])
    for turn in t.turns:
        s, e = turn.gen_span
        assert e > s and t.loss_mask[s:e] == [1] * (e - s) and len(t.logprobs) == len(t.token_ids)
        assert all(lp <= 0 for lp in t.logprobs[s:e]) and any(lp < 0 for lp in t.logprobs[s:e])
    # a random model rarely finishes the task: its episode has the env's reward or is masked with a reason
    if t.masked:
        assert t.mask_reason.split(":")[0] in {"no_reward", "harness_crashed"}, t.mask_reason
    else:
        assert t.metadata.get("env_task") and sum(turn.reward for turn in t.turns) == t.total_reward
