"""``BrowserEnv``: what every browser env shares, whatever its pages and its observation.

One episode holds one :class:`~turngym.sandboxes.browser.PageLease` (a fresh browser context) from
a :class:`~turngym.sandboxes.browser.BrowserPool` (the process-wide shared pool unless one is passed
in). Tools run page functions through :meth:`BrowserEnv.call_page`, which turns playwright failures
into tool errors. After each turn the env reads the page again (:meth:`_page_message`, the
subclass's observation), reports JavaScript errors the page raised and asks the subclass for notes
(:meth:`_episode_notes`, which may end the episode).

Faults: a browser that dies mid-episode, or a page that stops responding, ends the episode with an
error observation and ``info["masked"] = True`` with a ``mask_reason`` (the pool relaunches the
browser for the next episode); the episode is never scored.

Forking (:meth:`Env.fork`): a new lease from the pool, brought to the same page state by replaying the
episode's page functions and verified by comparing state keys after every turn (:mod:`.fork`). Each leaf
says how its page starts (:meth:`BrowserEnv._fork_start`) and which members a fork gets fresh
(:attr:`BrowserEnv._fork_fresh`).

Live instances (``max_live``): each live env (reset or forked, not yet closed) may hold a browser
context, about 60 MiB of Chromium memory each. At most :attr:`BrowserEnv.max_live` envs of one pool are
live at once: a reset past it waits (``live_wait_s``) for another env of the pool to close, a fork past it
is a :class:`ForkError` at once (a tree holding its paths' envs would wait for itself); closing an env
frees its place. Tree rollouts read ``max_live`` and reserve their paths within it
(:mod:`turngym.rollout.tree`), so their forks never meet the limit.

Leaves build on it: ``web-miniwob`` (MiniWoB++ task pages; element-id tools, :mod:`.element_tools`),
``gui-miniwob`` (pixels, :mod:`.pixels`), and the multi-page local sites of :mod:`.sites`
(``web-arena-lite``, ``web-shop``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from turngym.core.env import ForkError
from turngym.core.types import Message, ToolCall, ToolResult
from turngym.envs.browser.dom import Snapshot
from turngym.envs.browser.fork import PageLog, PageOp, replay
from turngym.sandboxes.browser import BrowserCrashed, BrowserError, BrowserPool, PageLease
from turngym.tools import ToolError
from turngym.tools.env import Env
from turngym.tools.parsers import render_calls

T = TypeVar("T")

#: live envs (reset or forked, not yet closed) each Chromium of the pool holds by default. Measured on
#: this project's machine (Debian Chromium, headless; web-miniwob click-test and book-flight, 1 to 32
#: live envs in one browser): each live env's context and page add about 60 MiB of proportional set size
#: (PSS) over a browser base of about 250-330 MiB. 16 keeps one Chromium near 1.3 GiB: room for several
#: pools, Docker sandboxes and a policy on a modest machine.
MAX_LIVE_PER_BROWSER = 16


class _LivePlaces:
    """The envs live on one pool (reset or forked, not yet closed), shared by threads and event loops.
    A weak set: an env dropped without ``close()`` gives its place back when it is collected."""

    def __init__(self) -> None:
        self.envs: weakref.WeakSet[BrowserEnv] = weakref.WeakSet()
        self.lock = threading.Lock()

    def take(self, env: BrowserEnv, limit: int) -> bool:
        with self.lock:
            if env in self.envs:
                return True
            if len(self.envs) >= limit:
                return False
            self.envs.add(env)
            return True

    def give(self, env: BrowserEnv) -> None:
        with self.lock:
            self.envs.discard(env)

    def count(self) -> int:
        with self.lock:
            return len(self.envs)


_LIVE: weakref.WeakKeyDictionary[BrowserPool, _LivePlaces] = weakref.WeakKeyDictionary()
_LIVE_LOCK = threading.Lock()


def live_places(pool: BrowserPool) -> _LivePlaces:
    """The live envs of ``pool`` (made on first use)."""
    with _LIVE_LOCK:
        places = _LIVE.get(pool)
        if places is None:
            places = _LIVE[pool] = _LivePlaces()
        return places


def short_error(e: BaseException) -> str:
    """The first line of a playwright error, without its API prefixes (for observations)."""
    text = str(e).strip().splitlines()
    first = text[0] if text else type(e).__name__
    return first.replace("Locator.", "").replace("Page.", "")[:300]


#: a scripted expert's action: the tool calls of one turn, in order
Calls = list[ToolCall]


def call(name: str, **arguments: object) -> ToolCall:
    """A tool call of a browser env's scripted expert; :meth:`BrowserEnv.expert_action` writes an
    expert's calls under the env's own parser."""
    return ToolCall(name=name, arguments=dict(arguments))


class BrowserEnv(Env):
    """Base of the browser envs (not registered itself).

    Args:
        pool: a :class:`BrowserPool`; default the process-wide shared one.
        viewport: browser viewport in CSS px.
        scale: device scale factor (screenshots have ``scale`` pixels per CSS px).
        action_timeout_s: limit of one browser action.
        load_timeout_s: limit for loading a page.
        max_live: at most this many envs of the pool live at once (reset or forked, not yet closed);
            default :data:`MAX_LIVE_PER_BROWSER` per browser of the pool; never above the pool's
            capacity (its contexts at once). See :attr:`max_live`.
        live_wait_s: how long a reset waits for a live place when the pool has ``max_live`` live envs
            (None: until one closes, as a lease waits for a full pool); past it, a clear error.
        max_turns, parser, ...: as for every :class:`~turngym.tools.env.Env`.

    A subclass implements ``_reset`` (lease a page with :attr:`pool`, load it, return the task),
    ``_page_message(initial)`` (the observation of the current page; set :attr:`snap`), and may
    override ``_episode_notes`` (check the page after each turn), ``_page_info`` (extra step info),
    ``_turn_reward``, ``_state_key`` and ``_expert_calls`` (its scripted expert).
    """

    default_max_turns = 10
    #: what the subclass calls its agent in the system prompt
    system_intro = ""
    forkable = True
    _fork_shared: tuple[str, ...] = ("_pool",)
    #: members a fork gets fresh (a copy of the value given here) instead of a deep copy of the parent's:
    #: live browser objects, and per-episode resources the fork must open for itself in ``_fork_start``
    _fork_fresh: dict[str, Any] = {"lease": None, "_live": None}

    def __init__(
        self,
        *,
        pool: BrowserPool | None = None,
        viewport: tuple[int, int] = (500, 320),
        scale: float = 1.0,
        action_timeout_s: float = 5.0,
        load_timeout_s: float = 10.0,
        max_live: int | None = None,
        live_wait_s: float | None = None,
        **kwargs: Any,
    ):
        if scale <= 0:
            raise ValueError("scale must be > 0")
        if max_live is not None and int(max_live) < 1:
            raise ValueError(f"max_live must be >= 1, got {max_live}")
        if live_wait_s is not None and live_wait_s < 0:
            raise ValueError(f"live_wait_s must be >= 0, got {live_wait_s}")
        self._pool = pool
        self._max_live = None if max_live is None else int(max_live)
        self.live_wait_s = live_wait_s
        #: the pool's live places while this env holds one (from its first reset, or its fork, to close)
        self._live: _LivePlaces | None = None
        self.viewport = (int(viewport[0]), int(viewport[1]))
        self.scale = float(scale)
        self.action_timeout_s = action_timeout_s
        self.load_timeout_s = load_timeout_s
        super().__init__(**kwargs)
        self.lease: PageLease | None = None
        self.instruction = ""
        self.snap = Snapshot()
        self.fault = ""
        self._paid = False
        self._seen_errors = 0
        #: the page functions each turn ran and the state key after each observation (for fork replay)
        self._page_log = PageLog()

    # ------------------------------------------------------------------ the scripted expert
    def expert_action(self) -> str | Message | None:
        """The scripted expert's next action under this env's parser: a leaf's expert returns its tool
        calls (:meth:`_expert_calls`) and the parser writes them (``render_calls``), so an env made
        with ``parser="openai"`` gets an assistant message with structured ``tool_calls``, and a
        protocol that cannot carry a call says so (``ValueError``)."""
        calls = self._expert_calls()
        return render_calls(self.parser, calls) if calls else None

    def _expert_calls(self) -> Calls | None:
        """The leaf's scripted expert: its next calls as :func:`call` text, or None."""
        return None

    # ------------------------------------------------------------------ browser plumbing
    @property
    def pool(self) -> BrowserPool:
        """The caller's pool, or the process-wide shared one (reopened if it was closed)."""
        if self._pool is None:
            return BrowserPool.shared()
        return self._pool

    @property
    def max_live(self) -> int:
        """At most this many envs of this env's pool are live at once (reset or forked, not yet closed):
        the ``max_live`` given, else :data:`MAX_LIVE_PER_BROWSER` per browser of the pool, and never more
        than the pool's capacity (a fork past it could not lease a context). Tree rollouts reserve their
        paths within it."""
        pool = self.pool
        limit = self._max_live if self._max_live is not None else MAX_LIVE_PER_BROWSER * pool.size
        return min(limit, pool.capacity)

    def _live_error(self, limit: int, places: _LivePlaces) -> str:
        return (
            f"{places.count()} envs of its browser pool are live (reset or forked, not yet closed) and "
            f"max_live is {limit}; close one (its place is freed on close), or raise max_live= (and the "
            "pool's capacity: size, contexts_per_browser)"
        )

    async def _take_live(self) -> None:
        """A live place for a reset: at once if one is free, else wait up to ``live_wait_s``."""
        if self._live is not None:
            return  # held since an earlier reset or the fork
        limit, places = self.max_live, live_places(self.pool)
        deadline = None if self.live_wait_s is None else time.monotonic() + self.live_wait_s
        while not places.take(self, limit):
            if deadline is not None and time.monotonic() >= deadline:
                name = self.spec.id if self.spec is not None else type(self).__name__
                raise BrowserError(
                    f"{name} cannot reset: no live place within {self.live_wait_s:g}s; "
                    + self._live_error(limit, places)
                )
            await asyncio.sleep(0.05)  # other envs close on other threads and loops: poll
        self._live = places

    def _give_live(self) -> None:
        places, self._live = self._live, None
        if places is not None:
            places.give(self)

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        self._check_open()
        held = self._live is not None
        await self._take_live()
        try:
            return await super().areset(seed=seed, options=options)
        except BaseException:
            if not held:  # a reset that failed leaves the env as it was: holding no place
                self._give_live()
            raise

    async def aclose(self) -> None:
        try:
            await super().aclose()
        finally:
            self._give_live()

    async def call_page(self, fn: Callable[..., Awaitable[T]], *args: Any, timeout: float | None = None) -> T:
        """Run ``fn(page, *args)`` in this episode's page; a playwright failure becomes a ``ToolError``."""

        ok = False
        try:
            result = await self._run_page(fn, *args, timeout=timeout)
            ok = True
            return result
        finally:
            self._page_log.record(PageOp(fn, self._log_args(args), timeout, ok))

    async def _run_page(self, fn: Callable[..., Awaitable[T]], *args: Any, timeout: float | None = None) -> T:
        """:meth:`call_page` without recording it (fork replay)."""
        from playwright.async_api import Error as PlaywrightError

        if self.lease is None:
            raise BrowserError("no page: the episode has not started or the browser crashed")
        try:
            return await self.lease.run(fn, *args, timeout=timeout)
        except (BrowserCrashed, BrowserError):
            raise
        except TimeoutError as e:
            raise ToolError(f"the browser action timed out: {e}") from e
        except PlaywrightError as e:
            raise ToolError(short_error(e)) from e

    async def _release(self) -> None:
        lease, self.lease = self.lease, None
        if lease is not None:
            with contextlib.suppress(Exception):
                await lease.close()

    def _begin_episode(self, instruction: str) -> None:
        """Reset the per-episode fault bookkeeping once the episode's page is up."""
        self.instruction = instruction
        self.fault = ""
        self._paid = False
        self._seen_errors = len(self.lease.page_errors) if self.lease else 0

    async def _first_page(self) -> Message:
        """The episode's first observation (a leaf's ``_reset`` calls it once the page is up); starts the
        page log that :meth:`fork` replays."""
        first = await self._page_message(initial=True)
        self._page_log.start(self._state_key())
        return first

    def _system_message(self) -> Message:
        return Message(role="system", content=(self.system_intro + "\n\n" + self.tool_instructions()).strip())

    # ------------------------------------------------------------------ subclass hooks
    async def _page_message(self, initial: bool) -> Message:
        """The observation of the current page."""
        raise NotImplementedError

    async def _episode_notes(self) -> list[str]:
        """Called after each turn's observation; may call ``end_episode``; returns notes to show."""
        return []

    def _page_info(self) -> dict[str, Any]:
        """What each step's ``info`` says about the page (besides the fault mask)."""
        return {}

    # ------------------------------------------------------------------ env hooks
    async def _observe(self, results: list[ToolResult]) -> list[Message]:
        if self.fault:
            return []
        if self.lease is None or self.lease.crashed:
            return [self._crash("the browser crashed during this turn")]
        try:
            msg = await self._page_message(initial=False)
        except BrowserCrashed:
            return [self._crash("the browser crashed during this turn")]
        except Exception as e:  # noqa: BLE001 - a hung or broken page is a fault, reported not raised
            return [self._crash(f"the page stopped responding: {short_error(e)}")]
        self._page_log.end_turn(self._state_key())
        notes = []
        errors = self.lease.page_errors[self._seen_errors :] if self.lease else []
        self._seen_errors += len(errors)
        if errors:
            notes.append("JavaScript errors on the page: " + " | ".join(errors[:3]))
        notes += await self._episode_notes()
        if notes:
            msg = msg.model_copy(update={"content": (msg.content + "\n\n" + "\n".join(notes)).strip()})
        return [msg]

    def _crash(self, why: str) -> Message:
        self.fault = why
        self.end_episode()
        return Message(role="user", content=f"Error: {why}. The episode is over and will not be scored.")

    def _step_info(self) -> dict[str, Any]:
        info = self._page_info()
        if self.fault:
            info.update(masked=True, mask_reason=f"browser fault: {self.fault}")
        return info

    def _state_key(self) -> str:
        return self.snap.key()

    async def _close(self) -> None:
        await self._release()  # the pool (shared or the caller's) outlives the env

    # ------------------------------------------------------------------ forking
    async def _fork_start(self) -> None:
        """On the fork: lease a page from :attr:`pool` and load the episode's first page, as ``_reset`` did
        (same task, same page seed, same start URL and cookies; a site of the fork's own)."""
        raise NotImplementedError

    def _fork_refusal(self) -> str:
        """Why this episode cannot be forked now ("" if it can)."""
        if self.fault:
            return f"the episode's browser failed ({self.fault}); a masked episode cannot be forked"
        if self.lease is not None and self.lease.crashed:
            return "the browser crashed"
        if self.lease is None and not self._done:
            return "the episode has no page (its browser crashed or was released)"
        if self.lease is not None and not self._page_log.keys:
            return "the episode's first page was never observed"
        pool = self.lease.pool if self.lease is not None else None
        if pool is not None and pool.stats.active >= pool.capacity:
            # waiting would deadlock a caller that holds the leases (e.g. a tree of forks): refuse instead
            return (
                f"the browser pool is full ({pool.stats.active} of {pool.capacity} contexts leased); close "
                "an env or make the pool larger (size, contexts_per_browser; $TURNGYM_BROWSERS, "
                "$TURNGYM_CONTEXTS_PER_BROWSER)"
            )
        return self._page_log.unreplayable

    def _fork_copy(self) -> Env:
        # live browser objects are not copied: the fork gets the _fork_fresh values, then its own page
        fresh = {k: self.__dict__[k] for k in self._fork_fresh if k in self.__dict__}
        for k in fresh:
            self.__dict__[k] = None
        try:
            child = super()._fork_copy()
        finally:
            self.__dict__.update(fresh)
        for k, v in self._fork_fresh.items():
            child.__dict__[k] = copy.copy(v)
        return child

    async def _fork(self) -> Env:
        name = self.spec.id if self.spec is not None else type(self).__name__
        why = self._fork_refusal()
        if why:
            raise ForkError(f"{name} cannot fork now: {why}")
        try:
            child = self._fork_copy()
        except (TypeError, copy.Error) as e:  # a live member (a server, a socket) that cannot be copied
            raise ForkError(
                f"{name}: its state could not be copied ({type(e).__name__}: {e}); name read-only live "
                "members in _fork_shared, and members the fork must open for itself in _fork_fresh"
            ) from e
        assert isinstance(child, BrowserEnv)
        limit, places = self.max_live, live_places(self.pool)
        if not places.take(child, limit):  # never waits: the caller may hold the envs that would free one
            raise ForkError(f"{name} cannot fork now: " + self._live_error(limit, places))
        child._live = places
        if self.lease is None:  # a finished episode whose page was released: a finished fork, no page
            return child
        try:
            await child._fork_start()
            # the fork's own copy of the log: the original may go on stepping while the fork replays
            await replay(child, child._page_log, child._replay_op)
            child._seen_errors = len(child.lease.page_errors) if child.lease else 0
        except BaseException as e:
            with contextlib.suppress(Exception):
                await child.aclose()  # its lease and its own site state; the original is untouched
            if isinstance(e, ForkError):
                raise ForkError(f"{name}: {e}") from e
            if isinstance(e, BrowserCrashed):
                raise ForkError(
                    f"{name}: the browser died while the fork started or replayed the episode ({e}); "
                    "the original env is unchanged"
                ) from e
            if isinstance(e, Exception):
                raise ForkError(f"{name}: the fork's replay failed: {short_error(e)}") from e
            raise
        return child

    def _log_args(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """A page call's arguments as the page log keeps them (independent of this env's resources)."""
        return args

    def _replay_args(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """The inverse of :meth:`_log_args`, for this env (the fork replaying the log)."""
        return args

    async def _replay_op(self, op: PageOp) -> bool:
        """Run one recorded page function on this (forked) env's page; whether it succeeded."""
        try:
            await self._run_page(op.fn, *self._replay_args(op.args), timeout=op.timeout)
        except ToolError:
            return False
        return True
