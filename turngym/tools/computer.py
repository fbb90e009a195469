"""The OSWorld-style computer tools, one home for every GUI family: click, double and right click, move,
drag, type text, press a key, hotkey, wait and done, in screenshot pixels.

The tools are made by factories (:func:`pointer_tools`, :func:`keyboard_tools`) that a
family calls in its class body, so each family keeps its tool order and its own wording of the
summaries, while argument names, checks (clicks 1-3, text length, wait bounds) and replies are shared.
What a tool does is the family's :class:`ComputerBackend`: a browser page (``gui-miniwob``) or
``xdotool`` through the desktop helper (``gui-desktop``). A backend converts and checks the screenshot
pixels (a point off the screenshot is a ``ToolError``) and key names; after a call succeeds the tool
calls :meth:`ComputerBackend._computer_did` (``gui-desktop`` records it for fork replay).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from turngym.tools.decorator import tool
from turngym.tools.toolbox import ToolError

MAX_TYPE_CHARS = 2000
MAX_WAIT_S = 10.0
Button = Literal["left", "middle", "right"]


class ComputerBackend:
    """What the computer tools need from a family: pointer and keyboard in screenshot pixels."""

    async def pointer_click(self, x: float, y: float, button: str, clicks: int) -> None:
        raise NotImplementedError

    async def pointer_move(self, x: float, y: float) -> None:
        raise NotImplementedError

    async def pointer_drag(self, x: float, y: float) -> None:
        """Press the left button where the mouse is, move to (x, y), release."""
        raise NotImplementedError

    async def keys_type(self, text: str) -> None:
        raise NotImplementedError

    async def keys_press(self, key: str) -> None:
        """One key (or a chord where the family allows one) as the agent named it."""
        raise NotImplementedError

    async def keys_hotkey(self, keys: list[str]) -> None:
        raise NotImplementedError

    async def pause(self, seconds: float) -> None:
        raise NotImplementedError

    def _computer_did(self, name: str, args: dict[str, Any]) -> None:
        """A computer tool call succeeded (default: nothing)."""


def common_key(key: str, aliases: dict[str, str]) -> str | None:
    """The family's name for ``key`` if it is one of its ``aliases`` (any case) or F1-F12, else None
    (the family looks further); ``ToolError`` for an empty name."""
    low = key.strip().lower()
    if not low:
        raise ToolError("empty key name")
    if low in aliases:
        return aliases[low]
    if re.fullmatch(r"f([1-9]|1[0-2])", low):
        return low.upper()
    return None


def _named(fn: Any, name: str, description: str | None, terminal: bool = False) -> Any:
    fn.__name__ = fn.__qualname__ = name
    return tool(fn, name=name, description=description, terminal=terminal)


def pointer_tools() -> tuple[Any, Any, Any, Any, Any]:
    """``click, double_click, right_click, move_to, drag_to``."""

    async def click(self: Any, x: float, y: float, button: Button = "left", num_clicks: int = 1) -> str:
        """Move the mouse to (x, y) and click.

        Args:
            x: horizontal pixel of the screenshot
            y: vertical pixel of the screenshot
            button: mouse button
            num_clicks: 1, 2 or 3 clicks
        """
        if not 1 <= num_clicks <= 3:
            raise ToolError("num_clicks must be 1, 2 or 3")
        await self.pointer_click(x, y, button, num_clicks)
        self._computer_did("click", {"x": x, "y": y, "button": button, "num_clicks": num_clicks})
        return f"clicked at ({x:g}, {y:g})"

    def at_point(name: str, summary: str, reply: str, act: Any) -> Any:
        async def pointer(self: Any, x: float, y: float) -> str:
            """.

            Args:
                x: horizontal pixel
                y: vertical pixel
            """
            await act(self, x, y)
            self._computer_did(name, {"x": x, "y": y})
            return f"{reply} ({x:g}, {y:g})"

        return _named(pointer, name, summary)

    async def drag_to(self: Any, x: float, y: float) -> str:
        """Press the left button where the mouse is, drag to (x, y) and release.

        Args:
            x: horizontal pixel to drop at
            y: vertical pixel to drop at
        """
        await self.pointer_drag(x, y)
        self._computer_did("drag_to", {"x": x, "y": y})
        return f"dragged to ({x:g}, {y:g})"

    return (
        _named(click, "click", None),
        at_point("double_click", "Double-click at (x, y).", "double-clicked at",
                 lambda s, x, y: s.pointer_click(x, y, "left", 2)),
        at_point("right_click", "Right-click at (x, y).", "right-clicked at",
                 lambda s, x, y: s.pointer_click(x, y, "right", 1)),
        at_point("move_to", "Move the mouse to (x, y) without clicking.", "mouse at",
                 lambda s, x, y: s.pointer_move(x, y)),
        _named(drag_to, "drag_to", None),
    )  # fmt: skip


def keyboard_tools(summaries: dict[str, str]) -> tuple[Any, Any, Any, Any, Any]:
    """``type, press, hotkey, wait, done``, each with the family's summary (``summaries[name]``);
    ``done`` ends the episode."""

    async def type_(self: Any, text: str) -> str:
        """.

        Args:
            text: the text to type
        """
        if len(text) > MAX_TYPE_CHARS:
            raise ToolError(f"text too long ({len(text)} > {MAX_TYPE_CHARS} characters); type it in parts")
        await self.keys_type(text)
        self._computer_did("type", {"text": text})
        return f"typed {len(text)} characters"

    async def press_(self: Any, key: str) -> str:
        """.

        Args:
            key: key name
        """
        await self.keys_press(key)
        self._computer_did("press", {"key": key})
        return f"pressed {key}"

    async def hotkey_(self: Any, keys: list[str]) -> str:
        """.

        Args:
            keys: key names, modifiers first
        """
        if not keys:
            raise ToolError("hotkey needs at least one key")
        await self.keys_hotkey(list(keys))
        self._computer_did("hotkey", {"keys": list(keys)})
        return f"pressed {'+'.join(keys)}"

    async def wait_(self: Any, seconds: float = 1.0) -> str:
        """.

        Args:
            seconds: how long (at most 10)
        """
        if not 0 <= seconds <= MAX_WAIT_S:
            raise ToolError(f"seconds must be between 0 and {MAX_WAIT_S:g}")
        await self.pause(seconds)
        self._computer_did("wait", {"seconds": seconds})
        return f"waited {seconds:g} s"

    async def done(self: Any) -> str:
        return "done"

    return (
        _named(type_, "type", summaries["type"]),
        _named(press_, "press", summaries["press"]),
        _named(hotkey_, "hotkey", summaries["hotkey"]),
        _named(wait_, "wait", summaries["wait"]),
        _named(done, "done", summaries["done"], terminal=True),
    )
