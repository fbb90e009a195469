"""Every one of the 130 MiniWoB++ tasks makes, resets (through its own JavaScript) and renders."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from turngym.envs.web.env import WebMiniWoBEnv
from turngym.envs.web.tasks import list_tasks

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def env():
    env = WebMiniWoBEnv("all", screenshot=True)  # one env (and the shared browser) for all tasks
    yield env
    env.close()


@pytest.mark.parametrize("task", list_tasks())
def test_task_resets_and_renders(env, task):
    obs, info = env.reset(seed=0, options={"task": task})
    assert info["task_id"].startswith(f"miniwob/{task}/")
    assert info["instruction"].strip(), "the task gave no instruction"
    page = obs[1]
    assert page.content.startswith(f"Task: {info['instruction']}")
    assert any(n.id is not None for n in env.snap.nodes), page.content
    assert Image.open(io.BytesIO(page.images[0])).size == (160, 210)
    obs, reward, terminated, truncated, info = env.step(
        '<tool_call>{"name": "noop", "arguments": {"wait_ms": 0}}</tool_call>'
    )
    assert not info["invalid_action"] and not info.get("masked"), info["error"]
    assert "Page:" in obs[-1].content
