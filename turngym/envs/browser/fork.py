"""Forking a live browser episode: a new browser context brought to the same page state by replay.

A page cannot be serialized, so a :class:`~turngym.envs.browser.env.BrowserEnv` records its episode
as it runs: every page function its tools ran through :meth:`BrowserEnv.call_page` (the function and
its arguments, in order, and whether it failed), grouped by turn, and the state key
(:meth:`Env._state_key`: the pruned DOM's :meth:`Snapshot.key`, plus the task or URL) of each
observation. ``env.fork()`` then

1. deep-copies the env's Python state (task, turn, messages, RNG, this log) into a new env that holds
   no page (:attr:`BrowserEnv._fork_fresh` names the members a fork must not share or copy),
2. lets the leaf start the same page in a new lease from the pool (:meth:`BrowserEnv._fork_start`:
   MiniWoB starts the task page with the same ``Math.seedrandom`` seed; a site opens a session or
   database of the fork's own and the start URL),
3. replays the log turn by turn in the new context (the same page functions with the same
   arguments; element ids are re-assigned by re-reading the page after each turn, as the original
   episode did), and
4. verifies: after the start and after every replayed turn, the fork's state key must equal the one
   the original episode saw then. A mismatch (a page with timers, animations or randomness the seed
   does not cover) is a :class:`~turngym.core.env.ForkError` naming the turn ("replay diverged"),
   never a silently different fork. A browser that dies during the replay is a ``ForkError`` too.
   On any failure the new lease is closed; the original env is never touched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from turngym.core.env import ForkError


@dataclass(frozen=True)
class PageOp:
    """One page function a tool ran: ``fn(page, *args)`` with ``timeout``; ``ok`` False if it raised."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    timeout: float | None
    ok: bool

    def describe(self) -> str:
        return f"{getattr(self.fn, '__name__', self.fn)}{self.args!r}"


@dataclass
class PageLog:
    """The episode's page history: ``turns[i]`` the page functions of turn ``i + 1``; ``keys[i]`` the state
    key observed after the start (``keys[0]``) and after each turn (``keys[i]``, ``i >= 1``)."""

    turns: list[list[PageOp]] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    _current: list[PageOp] = field(default_factory=list)
    #: why this episode cannot be replayed (a tool the replay cannot repeat ran), or ""
    unreplayable: str = ""

    def start(self, key: str) -> None:
        self.turns, self.keys, self._current, self.unreplayable = [], [key], [], ""

    def record(self, op: PageOp) -> None:
        self._current.append(op)

    def end_turn(self, key: str) -> None:
        self.turns.append(self._current)
        self.keys.append(key)
        self._current = []

    def __deepcopy__(self, memo: dict[int, Any]) -> PageLog:
        # page functions and their (plain-data) arguments are immutable records: the lists are copied
        new = PageLog([list(t) for t in self.turns], list(self.keys), list(self._current), self.unreplayable)
        memo[id(self)] = new
        return new


def diverged(where: str, expected: str, got: str) -> ForkError:
    """The ``ForkError`` of a replay whose page differs from the original's."""
    return ForkError(
        f"replay diverged {where}: the fork's page (state key {got}) differs from the original's "
        f"(state key {expected}); the page is not deterministic under replay (timers, animations or "
        "randomness the page seed does not cover), so it cannot be forked"
    )


async def replay(child: Any, log: PageLog, run_op: Callable[[PageOp], Any]) -> None:
    """Bring ``child`` (started at the episode's first page) to the state of ``log``'s last turn.

    ``run_op(op)`` runs one page function in the child's page and returns whether it succeeded.
    Raises :class:`ForkError` when an observation's state key (or a call's success) differs.
    """
    await child._page_message(initial=True)
    got = child._state_key()
    if got != log.keys[0]:
        raise diverged("at the start page", log.keys[0], got)
    for turn, (ops, key) in enumerate(zip(log.turns, log.keys[1:], strict=True), start=1):
        for op in ops:
            ok = await run_op(op)
            if ok != op.ok:
                state = "failed" if op.ok else "succeeded"
                raise ForkError(
                    f"replay diverged at turn {turn}: {op.describe()} {state} in the fork but not in the "
                    "original episode"
                )
        await child._page_message(initial=False)
        got = child._state_key()
        if got != key:
            raise diverged(f"at turn {turn}", key, got)
