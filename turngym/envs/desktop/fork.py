"""Forking a live ``gui-desktop`` episode by replay.

A desktop (X server, applications, their memory) cannot be copied, so a fork

1. deep-copies the env's Python state (task, turn, RNG, the episode's log of successful tool calls per
   turn and the state key seen after the start and after each turn) into an env that holds no desktop,
2. starts a fresh desktop from the pool with the same task files and application,
3. replays the log turn by turn through the same tool methods, and
4. after the start and after each replayed turn compares the state key (screenshot hash, accessibility
   tree hash and the checker's reading of the files) with the original's. A mismatch is a
   :class:`~turngym.core.env.ForkError` naming the turn ("replay diverged"), never a silently different
   fork; the new desktop is released and the original env is never touched.
"""

from __future__ import annotations

from typing import Any

from turngym.core.env import ForkError
from turngym.tools import ToolError


def diverged(where: str, expected: str, got: str) -> ForkError:
    return ForkError(
        f"gui-desktop: replay diverged {where}: the fork's desktop (state key {got}) differs from the "
        f"original's (state key {expected}); the applications did not repeat the episode exactly, so it "
        "cannot be forked"
    )


async def replay_into(child: Any, parent: Any) -> None:
    """Bring ``child`` (a copy of ``parent`` without a desktop) to ``parent``'s state on a new desktop."""
    if "dead" in child._keys:
        raise ForkError("gui-desktop: the original episode's desktop died; it cannot be replayed")
    log = [list(turn) for turn in child._log]
    keys = list(child._keys)
    await child._start_desktop(child.current)
    await child._screen_message("")
    if child._last_key != keys[0]:
        raise diverged("at the start", keys[0], child._last_key)
    child._mouse = (0, 0)
    for turn, (calls, key) in enumerate(zip(log, keys[1:], strict=False), start=1):
        for name, args in calls:
            try:
                await getattr(child, name)(**args)
            except ToolError as e:
                raise ForkError(
                    f"gui-desktop: replay diverged at turn {turn}: {name}{args} failed ({e})"
                ) from e
        await child._screen_message("")
        if child._last_key != key:
            raise diverged(f"at turn {turn}", key, child._last_key)
    child._turn_calls = []
    child._log, child._keys = log, keys
