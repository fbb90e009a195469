"""The computer actions of ``gui-desktop``: the shared OSWorld-style tools of
:mod:`turngym.tools.computer` over the desktop (``xdotool`` through the desktop's helper), plus
``scroll`` in wheel clicks, ``fail`` and, with the accessibility tree on, ``click_element``.

Every tool checks its input before anything reaches the desktop: points must lie on the screenshot,
key names must be known (OSWorld / pyautogui names or X keysyms), typed text is capped, waits are
bounded. Each successful call is recorded (name and arguments, per turn) so a fork can replay it.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from turngym.sandboxes.docker import run_blocking
from turngym.tools import ToolError, tool
from turngym.tools.computer import Button, ComputerBackend, common_key, keyboard_tools, pointer_tools

MAX_SCROLL = 50
_BUTTONS = {"left": 1, "middle": 2, "right": 3}
_ALIASES = {
    "enter": "Return", "return": "Return", "tab": "Tab", "backspace": "BackSpace", "delete": "Delete",
    "del": "Delete", "esc": "Escape", "escape": "Escape", "space": "space", "up": "Up", "down": "Down",
    "left": "Left", "right": "Right", "home": "Home", "end": "End", "pageup": "Prior", "pagedown": "Next",
    "pgup": "Prior", "pgdn": "Next", "insert": "Insert", "ctrl": "ctrl", "control": "ctrl", "shift": "shift",
    "alt": "alt", "super": "super", "win": "super", "cmd": "super", "meta": "super", "menu": "Menu",
    "capslock": "Caps_Lock", "printscreen": "Print",
}  # fmt: skip
_PUNCT = {
    "+": "plus", "-": "minus", "=": "equal", "/": "slash", "\\": "backslash", ".": "period", ",": "comma",
    ";": "semicolon", "'": "apostrophe", "`": "grave", "[": "bracketleft", "]": "bracketright", "*": "asterisk",
    "!": "exclam", "?": "question", ":": "colon", "(": "parenleft", ")": "parenright", "_": "underscore",
}  # fmt: skip
_KEYSYMS = set(_ALIASES.values()) | {f"F{i}" for i in range(1, 13)} | set(_PUNCT.values())


def normalise_key(key: str) -> str:
    """One key name (OSWorld/pyautogui style, or an X keysym) -> an xdotool keysym; ``ToolError`` if unknown."""
    named = common_key(key, _ALIASES)
    if named is not None:
        return named
    k = key.strip()
    if len(k) == 1 and k.isascii() and k.isalnum():
        return k
    if k in _PUNCT:
        return _PUNCT[k]
    if k in _KEYSYMS:
        return k
    raise ToolError(f"unknown key {key!r}; use names like enter, tab, backspace, esc, up, ctrl, a, f5")


def combo(keys: list[str]) -> str:
    """Keys pressed together (modifiers first) as one xdotool chord, e.g. ``ctrl+s``."""
    if not keys:
        raise ToolError("no keys given")
    if len(keys) > 5:
        raise ToolError("at most 5 keys at once")
    return "+".join(normalise_key(k) for k in keys)


def _move(x: int, y: int) -> dict[str, Any]:
    return {"a": "move", "x": x, "y": y}


def split_chord(key: str) -> list[str]:
    """``"ctrl+shift+n"`` -> ``["ctrl", "shift", "n"]`` (a lone ``+`` stays a key)."""
    return [key] if key.strip() == "+" else [p for p in key.split("+") if p != ""] or [key]


#: the summaries of the shared computer tools (:func:`turngym.tools.computer.keyboard_tools`)
_SUMMARIES = {
    "type": 'Type text with the keyboard into whatever has focus ("\\n" presses Enter).',
    "press": 'Press and release one key or chord (e.g. "enter", "tab", "esc", "a", "ctrl+s").',
    "hotkey": 'Press keys together, e.g. ["ctrl", "s"].',
    "wait": "Wait for the screen to change (a dialog, a slow application).",
    "done": "Say the task is complete; ends the episode (the checker reads the real state).",
}


class DesktopActions(ComputerBackend):
    """Mixin of the computer tools (put it before ``Env``): the shared ones of
    :mod:`turngym.tools.computer` over ``xdotool``, plus ``scroll`` in wheel clicks, ``fail`` and
    ``click_element``. The host env provides ``desk`` (the live :class:`DesktopSandbox`),
    ``screen_size`` (screenshot pixels), ``_scale`` (screen pixels per screenshot pixel), ``_nodes``
    (the element list of the last observation) and ``_record``."""

    desk: Any
    screen_size: tuple[int, int]
    _scale: float
    _nodes: list[dict[str, Any]]
    _mouse: tuple[int, int]

    def _record(self, name: str, args: dict[str, Any]) -> None:
        raise NotImplementedError

    def _computer_did(self, name: str, args: dict[str, Any]) -> None:
        self._record(name, args)

    def _screen_point(self, x: float, y: float) -> tuple[int, int]:
        w, h = self.screen_size
        if not (0 <= x < w and 0 <= y < h):
            raise ToolError(f"({x:g}, {y:g}) is off the screen; x must be in [0, {w}) and y in [0, {h})")
        return int(x * self._scale), int(y * self._scale)

    async def _xdo(self, *actions: dict[str, Any]) -> None:
        if self.desk is None:
            raise ToolError("no desktop is running (the episode is over)")
        chars = sum(len(a.get("text", "")) for a in actions)
        await run_blocking(functools.partial(self.desk.act, list(actions), timeout=15.0 + 0.03 * chars))

    # ------------------------------------------------------------------ backend of the computer tools
    async def pointer_click(self, x: float, y: float, button: str, clicks: int) -> None:
        sx, sy = self._screen_point(x, y)
        await self._xdo(_move(sx, sy), {"a": "click", "button": _BUTTONS[button], "repeat": clicks})
        self._mouse = (sx, sy)

    async def pointer_move(self, x: float, y: float) -> None:
        sx, sy = self._screen_point(x, y)
        await self._xdo(_move(sx, sy))
        self._mouse = (sx, sy)

    async def pointer_drag(self, x: float, y: float) -> None:
        sx, sy = self._screen_point(x, y)
        await self._xdo(
            _move(*self._mouse), {"a": "down", "button": 1}, _move(sx, sy), {"a": "up", "button": 1}
        )
        self._mouse = (sx, sy)

    async def keys_type(self, text: str) -> None:
        if not text:
            raise ToolError("empty text")
        if any((ord(c) < 32 and c != "\n") or ord(c) == 127 for c in text):
            raise ToolError("text has control characters; press keys (tab, esc, ...) with press")
        actions: list[dict[str, Any]] = []
        for i, line in enumerate(text.split("\n")):
            if i:
                actions.append({"a": "key", "chord": "Return"})
            if line:
                actions.append({"a": "type", "text": line})
        await self._xdo(*actions)

    async def keys_press(self, key: str) -> None:
        await self._xdo({"a": "key", "chord": combo(split_chord(key))})

    async def keys_hotkey(self, keys: list[str]) -> None:
        await self._xdo({"a": "key", "chord": combo(keys)})

    async def pause(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    # ------------------------------------------------------------------ tools
    click, double_click, right_click, move_to, drag_to = pointer_tools()

    @tool
    async def scroll(self, dy: int, dx: int = 0) -> str:
        """Scroll the mouse wheel where the mouse is.

        Args:
            dy: wheel clicks down (negative: up)
            dx: wheel clicks right (negative: left)
        """
        if abs(dx) > MAX_SCROLL or abs(dy) > MAX_SCROLL:
            raise ToolError(f"at most {MAX_SCROLL} wheel clicks per call")
        wheel = [
            {"a": "click", "button": pos if count > 0 else neg, "repeat": abs(count)}
            for count, neg, pos in ((dy, 4, 5), (dx, 6, 7))
            if count
        ]
        if not wheel:
            raise ToolError("scroll needs dx or dy")
        await self._xdo(*wheel)
        self._record("scroll", {"dy": dy, "dx": dx})
        return f"scrolled ({dx}, {dy})"

    type, press, hotkey, wait, done = keyboard_tools(_SUMMARIES)

    @tool(terminal=True)
    async def fail(self) -> str:
        """Say the task cannot be done; ends the episode."""
        return "gave up"

    # ------------------------------------------------------------------ element tools
    def _node(self, element_id: int) -> dict[str, Any]:
        if not self._nodes:
            raise ToolError("no element list: make the env with a11y=True to act by element id")
        if not 0 <= element_id < len(self._nodes):
            raise ToolError(f"no element [{element_id}]; ids run from 0 to {len(self._nodes) - 1}")
        return self._nodes[element_id]

    def _node_center(self, element_id: int) -> tuple[float, float]:
        n = self._node(element_id)
        x, y = (n["x"] + n["w"] / 2) / self._scale, (n["y"] + n["h"] / 2) / self._scale
        w, h = self.screen_size
        if not (0 <= x < w and 0 <= y < h):
            raise ToolError(f"element [{element_id}] is not on the screen")
        return x, y

    @tool
    async def click_element(self, element_id: int, button: Button = "left", num_clicks: int = 1) -> str:
        """Click the center of an element of the accessibility tree (its [id] in the element list).

        Args:
            element_id: the element's id
            button: mouse button
            num_clicks: 1, 2 or 3 clicks
        """
        if not 1 <= num_clicks <= 3:
            raise ToolError("num_clicks must be 1, 2 or 3")
        x, y = self._node_center(element_id)
        await self.pointer_click(x, y, button, num_clicks)
        self._record("click_element", {"element_id": element_id, "button": button, "num_clicks": num_clicks})
        return f"clicked element [{element_id}]"
