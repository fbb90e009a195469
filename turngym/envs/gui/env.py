"""``gui-miniwob``: MiniWoB++ tasks through pixels, with OSWorld computer_13-style tools.

Observation: the goal and a PNG screenshot (of the task area by default, or the whole
viewport); no DOM. Coordinates are screenshot pixels (``scale`` pixels per CSS pixel) and
must lie on the screenshot. The env still reads the page's DOM each turn, privately, for
the state key and the scripted pixel expert (which clicks at element boxes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from turngym.envs.browser.env import Calls
from turngym.envs.browser.pixels import PixelObservation
from turngym.envs.web import page as wp
from turngym.envs.web.base import MiniWoBEnvBase
from turngym.envs.web.expert import GUI_EXPERT_TASKS, Step  # noqa: F401 - GUI_EXPERT_TASKS re-exported
from turngym.envs.web.expert import call as _call
from turngym.tools import ToolError, tool
from turngym.tools.computer import Button, ComputerBackend, common_key, keyboard_tools, pointer_tools

if TYPE_CHECKING:
    from playwright.async_api import Page

_KEY_ALIASES = {
    "enter": "Enter", "return": "Enter", "tab": "Tab", "backspace": "Backspace", "delete": "Delete",
    "del": "Delete", "esc": "Escape", "escape": "Escape", "space": " ", "up": "ArrowUp", "down": "ArrowDown",
    "left": "ArrowLeft", "right": "ArrowRight", "home": "Home", "end": "End", "pageup": "PageUp",
    "pagedown": "PageDown", "ctrl": "Control", "control": "Control", "shift": "Shift", "alt": "Alt",
    "cmd": "Meta", "meta": "Meta", "win": "Meta", "super": "Meta",
}  # fmt: skip
#: input types whose value is the typed text (date/time pickers take segment-wise keys instead)
_TYPEABLE = frozenset({"", "password", "email", "search", "tel", "url", "number"})


def normalise_key(key: str) -> str:
    """OSWorld/pyautogui key names ("enter", "ctrl", "a", "f5") -> Playwright key names."""
    named = common_key(key, _KEY_ALIASES)
    if named is not None:
        return named
    k = key.strip()
    if len(k) == 1 or k[0].isupper() or k.startswith("Arrow") or k.startswith("Numpad"):
        return k
    raise ToolError(f"unknown key {key!r}; use names like Enter, Tab, Backspace, ArrowUp, ctrl, a")


#: the summaries of the shared computer tools (:func:`turngym.tools.computer.keyboard_tools`)
_SUMMARIES = {
    "type": "Type text with the keyboard into whatever has focus.",
    "press": 'Press and release one key (e.g. "enter", "tab", "backspace", "a").',
    "hotkey": 'Press keys together, e.g. ["ctrl", "a"].',
    "wait": "Wait (for pages that change over time).",
    "done": "Say the task is complete; ends the episode (the page's own reward stands).",
}


async def _mouse_click(page: Page, x: float, y: float, button: str, clicks: int) -> None:
    await page.mouse.click(x, y, button=button, click_count=clicks)


async def _mouse_move(page: Page, x: float, y: float) -> None:
    # one jump, like pyautogui.moveTo (OSWorld's MOVE_TO): each intermediate event costs an animation frame
    await page.mouse.move(x, y)


async def _mouse_button(page: Page, down: bool, button: str) -> None:
    await (page.mouse.down(button=button) if down else page.mouse.up(button=button))


async def _drag(page: Page, x1: float, y1: float, x0: float, y0: float) -> None:
    """Drag from (x0, y0) to (x1, y1) (the target first, as :meth:`GuiMiniWoBEnv._point` passes it)."""
    await page.mouse.move(x0, y0)
    await page.mouse.down()
    await page.mouse.move(x1, y1, steps=10)
    await page.mouse.up()


async def _wheel(page: Page, x: float, y: float, dx: float, dy: float) -> None:
    await page.mouse.move(x, y)
    await page.mouse.wheel(dx, dy)


async def _type(page: Page, text: str) -> None:
    await page.keyboard.type(text)


async def _press(page: Page, key: str) -> None:
    await page.keyboard.press(key)


async def _wait(page: Page, ms: float) -> None:
    await page.wait_for_timeout(ms)


def _button_tool(name: str, summary: str, down: bool) -> Any:
    """A tool ``name(button)`` that presses (``down``) or releases a mouse button where the mouse is."""

    async def press_or_release(self: Any, button: Button = "left") -> str:
        await self.call_page(_mouse_button, down, button)
        return f"{button} button {'down' if down else 'up'}"

    press_or_release.__name__ = press_or_release.__qualname__ = name
    press_or_release.__doc__ = f"{summary}\n\nArgs:\n    button: mouse button\n"
    return tool(press_or_release)


class GuiMiniWoBEnv(ComputerBackend, PixelObservation, MiniWoBEnvBase):
    crop_area = wp.TASK_AREA

    """MiniWoB++ through screenshots (arguments of :class:`~turngym.envs.web.base.MiniWoBEnvBase`, plus):

    Args:
        crop_to_task: screenshot only MiniWoB's 160x210 task area (default) instead of the viewport.
    """

    system_intro = (
        "You control a computer's mouse and keyboard to complete a task shown on the screen. Each "
        "observation is a screenshot; coordinates are pixels of that screenshot, (0, 0) at the top left. "
        "The episode ends when the page reports the task finished or when you call done."
    )

    def __init__(self, task: str | list[str] | None = None, *, crop_to_task: bool = True, **kwargs: Any):
        super().__init__(task, **kwargs)
        self._init_screen(crop_to_task)
        self._mouse = (0.0, 0.0)

    async def _point(self, x: float, y: float, fn: Any, *args: Any) -> None:
        """Run the page function ``fn(page, cx, cy, *args)`` at the screenshot pixel (x, y) (``cx, cy``
        in CSS pixels); the mouse is there afterwards."""
        cx, cy = self._css(x, y)
        await self.call_page(fn, cx, cy, *args)
        self._mouse = (cx, cy)

    # ------------------------------------------------------------------ backend of the computer tools
    async def pointer_click(self, x: float, y: float, button: str, clicks: int) -> None:
        await self._point(x, y, _mouse_click, button, clicks)

    async def pointer_move(self, x: float, y: float) -> None:
        await self._point(x, y, _mouse_move)

    async def pointer_drag(self, x: float, y: float) -> None:
        await self._point(x, y, _drag, *self._mouse)

    async def keys_type(self, text: str) -> None:
        await self.call_page(_type, text)

    async def keys_press(self, key: str) -> None:
        await self.call_page(_press, normalise_key(key))

    async def keys_hotkey(self, keys: list[str]) -> None:
        await self.call_page(_press, "+".join(normalise_key(k) for k in keys))

    async def pause(self, seconds: float) -> None:
        await self.call_page(_wait, seconds * 1000)

    # ------------------------------------------------------------------ tools
    click, double_click, right_click, move_to, drag_to = pointer_tools()
    mouse_down = _button_tool(
        "mouse_down", "Press a mouse button where the mouse is (and keep it pressed).", True
    )
    mouse_up = _button_tool("mouse_up", "Release a mouse button.", False)

    @tool
    async def scroll(self, dx: float, dy: float) -> str:
        """Scroll by (dx, dy) pixels where the mouse is.

        Args:
            dx: horizontal pixels (positive scrolls right)
            dy: vertical pixels (positive scrolls down)
        """
        await self.call_page(_wheel, *self._mouse, dx, dy)
        return f"scrolled by ({dx:g}, {dy:g})"

    type, press, hotkey, wait, done = keyboard_tools(_SUMMARIES)

    # ------------------------------------------------------------------ observation
    async def _reset(self, rng: Any, options: dict[str, Any]) -> Any:
        self._mouse = (0.0, 0.0)
        return await super()._reset(rng, options)

    def render_step(self, step: Step) -> Calls | None:
        """An abstract expert step as pixel tool calls (None if pixels cannot express it here)."""
        x, y = self.pixel_center(step.node)
        if not (0 <= x < self.screen_size[0] and 0 <= y < self.screen_size[1]):
            return None
        if step.kind == "click":
            return [_call("click", x=x, y=y)]
        if step.kind == "fill" and step.node.type in _TYPEABLE:  # text fields typed key by key
            return [
                _call("click", x=x, y=y),
                _call("hotkey", keys=["ctrl", "a"]),
                _call("type", text=step.text),
            ]
        if step.kind == "press":
            return [_call("click", x=x, y=y), _call("press", key=step.text)]
        if step.kind == "drag" and step.target is not None:
            tx, ty = self.pixel_center(step.target)
            return [_call("move_to", x=x, y=y), _call("drag_to", x=tx, y=ty)]
        return None
