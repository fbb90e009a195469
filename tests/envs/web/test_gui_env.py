"""gui-miniwob and gui-miniwob-grounding on a real Chromium: pixels in, mouse/keyboard out."""

from __future__ import annotations

import io

import pytest
from PIL import Image

import turngym
from turngym.core.types import Message, ToolCall
from turngym.envs.gui.env import GuiMiniWoBEnv
from turngym.envs.gui.grounding import GroundingMiniWoBEnv
from turngym.testing import check_env

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def call(name: str, **args) -> Message:
    return Message(role="assistant", tool_calls=[ToolCall(name=name, arguments=args)])


def size(png: bytes) -> tuple[int, int]:
    return Image.open(io.BytesIO(png)).size


@pytest.mark.parametrize("env_id", ["gui-miniwob-v0", "gui-miniwob-grounding-v0"])
def test_conformance(env_id):
    check_env(env_id, task="click-button").raise_for_failures()


def test_observation_is_pixels_only_and_scaled():
    with turngym.make("gui-miniwob-v0", task="click-test", scale=2.0) as env:
        obs, info = env.reset(seed=0)
        assert size(obs[1].images[0]) == (320, 420) and env.screen_size == (320, 420)
        assert "[" not in obs[1].content and "button" not in obs[1].content.split("\n\n", 1)[1]
        x, y = env.pixel_center(env.snap.find(role="button")[0])
        _, reward, terminated, _, info = env.step(call("click", x=x, y=y))
        assert terminated and reward == 1.0


def test_off_screen_coordinates_and_bad_keys_are_errors():
    with GuiMiniWoBEnv("enter-text") as env:
        env.reset(seed=0)
        for action, expected in [
            (call("click", x=160, y=10), "off the screen"),
            (call("move_to", x=-1, y=10), "off the screen"),
            (call("drag_to", x=5, y=5000), "off the screen"),
            (call("click", x=5, y=5, num_clicks=9), "num_clicks"),
            (call("press", key="notakey"), "unknown key"),
            (call("hotkey", keys=[]), "at least one key"),
            (call("wait", seconds=60), "seconds must be"),
            (call("type", text="x" * 5000), "too long"),
        ]:
            _, reward, terminated, _, info = env.step(action)
            assert expected in info["error"] and info["invalid_action"] and not terminated


def test_keyboard_and_mouse_tools_drive_the_page():
    with GuiMiniWoBEnv("enter-text") as env:
        _, info = env.reset(seed=2)
        word = info["instruction"].split('"')[1]
        box = env.snap.find(role="textbox")[0]
        env.step(call("double_click", **dict(zip("xy", env.pixel_center(box), strict=True))))
        env.step(call("type", text="zz"))
        env.step(call("hotkey", keys=["ctrl", "a"]))
        env.step(call("press", key="backspace"))
        env.step(call("type", text=word))
        assert env.snap.find(role="textbox")[0].value == word
        submit = env.snap.find(role="button", name="Submit")[0]
        env.step(call("move_to", **dict(zip("xy", env.pixel_center(submit), strict=True))))
        _, reward, terminated, _, _ = env.step(call("mouse_down"))
        assert not terminated
        _, reward, terminated, _, _ = env.step(call("mouse_up"))
        assert terminated and reward == 1.0


def test_done_ends_the_episode_with_the_page_reward():
    with GuiMiniWoBEnv("click-test") as env:
        env.reset(seed=0)
        _, reward, terminated, truncated, info = env.step(call("done"))
        assert terminated and reward == 0.0 and info["reward_components"] == {"task": 0.0}


def test_drag_to_moves_a_draggable():
    with GuiMiniWoBEnv("drag-box") as env:
        env.reset(seed=0)
        small, large = (
            next(n for n in env.snap.nodes if n.dom_id == d) for d in ("draggableSmall", "draggableLarge")
        )
        env.step(call("move_to", **dict(zip("xy", env.pixel_center(small), strict=True))))
        env.step(call("drag_to", **dict(zip("xy", env.pixel_center(large), strict=True))))
        moved = next(n for n in env.snap.nodes if n.dom_id == "draggableSmall")
        assert moved.box != small.box and large.contains(*moved.center)
        submit = env.snap.find(role="button", name="Submit")[0]
        _, reward, terminated, _, _ = env.step(
            call("click", **dict(zip("xy", env.pixel_center(submit), strict=True)))
        )
        assert terminated and reward == 1.0


def test_grounding_rewards_points_inside_the_dom_box():
    with GroundingMiniWoBEnv(
        ["click-button", "click-link", "enter-text", "click-checkboxes"], scale=1.5
    ) as env:
        for seed in range(4):
            obs, info = env.reset(seed=seed)
            x, y, w, h = info["reference"]["box"]
            assert obs[1].content.startswith("Click on the ") and size(obs[1].images[0]) == (240, 315)
            assert env.lease is None  # the browser page is released right after the screenshot
            _, reward, terminated, _, _ = env.step(call("click", x=x + w / 2, y=y + h / 2))
            assert terminated and reward == 1.0
            env.reset(seed=seed)
            _, reward, terminated, _, _ = env.step(call("click", x=max(x - 3, 0), y=max(y - 3, 0)))
            assert terminated and reward == 0.0
        env.reset(seed=0)
        _, reward, terminated, truncated, info = env.step(call("click", x=999, y=5))
        assert truncated and reward == 0.0 and "off the screen" in info["error"]
        assert [t.name for t in env.tools] == ["click"]
