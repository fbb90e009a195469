"""Connections to MCP servers through the official ``mcp`` SDK, and the pool of shared ones.

Each :class:`McpConnection` runs its ``mcp.Client`` in a thread of its own, on that thread's event loop.
The SDK's transports are anyio context managers that must be entered and left in one task; an env, by
contrast, is reset from one event loop (the rollout engine's) or another (its own, for sync callers), and a
shared server serves many envs at once. The connection thread owns the client for its whole life; callers on
any loop submit calls to it (``asyncio.run_coroutine_threadsafe``) and await the answer on their own loop.

Stopping a connection cancels its task, so the SDK's transport shuts down as it is built to: for stdio it
closes the server's stdin, waits, then kills the server's process group, bounded in time. Connections still
open at interpreter exit are stopped by an ``atexit`` hook: no server outlives the process.

A server that dies mid-session (the stdio pipe closes, the HTTP endpoint goes away) makes the next call
raise :class:`ServerLost`; the connection is then marked lost, and the shared pool replaces it on the next
acquire.

One call's payload cannot take a shared connection down: the SDK encodes a request inside the session's
writer task, where an encoding error (a lone surrogate, bytes, NaN) would end the session for every env
that shares it. So ``call`` checks that name and arguments are JSON in valid Unicode first, and refuses
the call alone (``BadArguments``) when they are not.
"""

from __future__ import annotations

import asyncio
import atexit
import threading
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import mcp_types
from mcp import Client, StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

from turngym.envs.mcp.config import ServerConfig
from turngym.tools.arguments import BadArguments, call_problem

T = TypeVar("T")

#: stop() waits this long for the SDK's shutdown (stdin close, grace, SIGTERM, SIGKILL: about 6 s worst case)
STOP_TIMEOUT = 15.0


class McpConnectError(RuntimeError):
    """A server could not be started or reached, or did not list its tools in time."""


class ServerLost(RuntimeError):
    """The server died or its connection closed mid-session."""

    mask_reason = "env_lost"


_LIVE: weakref.WeakSet[McpConnection] = weakref.WeakSet()


class McpConnection:
    """One live MCP session, owned by a thread; ``start()`` then ``call()``s, then ``stop()``."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self.tools: list[mcp_types.Tool] = []
        self.lost: str | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._client: Client | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stopped = False

    # ------------------------------------------------------------------ lifecycle
    def _transport(self) -> Any:
        c = self.config
        if c.transport == "stdio":
            params = StdioServerParameters(command=str(c.command), args=list(c.args), env=c.env, cwd=c.cwd)
            return stdio_client(params)
        return str(c.url)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        try:
            async with Client(self._transport(), read_timeout_seconds=self.config.timeout) as client:
                tools: list[mcp_types.Tool] = []
                cursor: str | None = None
                while True:
                    page = await client.list_tools(cursor=cursor)
                    tools.extend(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
                self.tools = tools
                self._client = client
                self._ready.set()
                await asyncio.Event().wait()  # until stop() cancels this task
        except asyncio.CancelledError:
            pass
        except BaseException as e:  # noqa: BLE001 - reported to start() or as the loss reason
            self._error = e
        finally:
            self._client = None
            if not self._stopped and self.lost is None:
                self.lost = f"the connection to MCP server {self.config.name!r} ended"
            self._ready.set()

    def _run_thread(self) -> None:
        asyncio.run(self._main())

    def start(self) -> McpConnection:
        """Start (stdio) or reach (http) the server and list its tools; blocks up to ``connect_timeout``.

        Raises :class:`McpConnectError` naming the server and the cause; nothing is left running then.
        """
        if self._thread is not None:
            raise RuntimeError("an McpConnection starts once")
        self._thread = threading.Thread(target=self._run_thread, name=f"mcp-{self.config.name}", daemon=True)
        _LIVE.add(self)
        self._thread.start()
        ready = self._ready.wait(self.config.connect_timeout)
        if not ready or self._client is None:
            cause = (
                f"no answer within connect_timeout={self.config.connect_timeout}s"
                if not ready
                else _describe(self._error)
            )
            self.stop()
            raise McpConnectError(
                f"cannot connect to MCP server {self.config.name!r} ({self.config.describe()}): {cause}"
            )
        return self

    def stop(self) -> None:
        """End the session and (stdio) the server process; idempotent, bounded by ``STOP_TIMEOUT``."""
        self._stopped = True
        loop, task, thread = self._loop, self._task, self._thread
        if loop is not None and task is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop closed meanwhile: the thread is ending on its own
                pass
        if thread is not None and thread is not threading.current_thread():
            thread.join(STOP_TIMEOUT)
        _LIVE.discard(self)

    @property
    def alive(self) -> bool:
        return self._client is not None and self.lost is None and not self._stopped

    # ---------------------------------------------------------------------- calls
    async def call(self, name: str, arguments: dict[str, Any], timeout: float) -> mcp_types.CallToolResult:
        """Call tool ``name`` (its name on the server) from any event loop.

        Raises ``BadArguments`` (nothing is sent) when name or arguments are not JSON in valid Unicode,
        ``TimeoutError`` after ``timeout`` seconds, :class:`ServerLost` if the server is gone, and
        ``MCPError`` for other protocol errors (e.g. the server rejects the request).
        """
        problem = call_problem(name, arguments)
        if problem:
            raise BadArguments(f"not sent to MCP server {self.config.name!r}: {problem}")
        return await self._request(
            lambda client: client.call_tool(name, arguments, read_timeout_seconds=timeout), timeout
        )

    async def ping(self, timeout: float = 5.0) -> bool:
        """Whether the server answers within ``timeout``; a server that does not is marked lost. (A
        ``tools/list`` request: the protocol's ``ping`` is gone from its 2026-07-28 version.)"""
        try:
            await self._request(lambda client: client.list_tools(), min(timeout, self.config.timeout))
        except (ServerLost, TimeoutError, MCPError) as e:
            self.lost = self.lost or f"MCP server {self.config.name!r} did not answer a ping: {_describe(e)}"
            return False
        return True

    async def _request(self, make: Callable[[Client], Coroutine[Any, Any, T]], timeout: float) -> T:
        """Run ``make(client)`` on the connection's loop and await it here; transport faults -> ServerLost."""
        client, loop = self._client, self._loop
        if self.lost is not None or client is None or loop is None:
            raise ServerLost(self.lost or f"MCP server {self.config.name!r} is not running")
        coro = make(client)
        try:
            fut = asyncio.run_coroutine_threadsafe(coro, loop)
        except RuntimeError as e:  # the connection's loop is closed: its thread ended
            coro.close()
            self.lost = self.lost or f"the connection to MCP server {self.config.name!r} ended"
            raise ServerLost(self.lost) from e
        try:
            return await asyncio.wait_for(asyncio.wrap_future(fut), timeout + 1.0)
        except MCPError as e:
            if e.code == mcp_types.REQUEST_TIMEOUT:
                raise TimeoutError(e.message) from e
            if e.code == mcp_types.CONNECTION_CLOSED:
                self.lost = (
                    f"MCP server {self.config.name!r} closed the connection ({self.config.describe()})"
                )
                raise ServerLost(self.lost) from e
            raise
        except (asyncio.CancelledError, TimeoutError):
            fut.cancel()
            raise
        except (OSError, EOFError) as e:
            self.lost = f"MCP server {self.config.name!r} is unreachable: {_describe(e)}"
            raise ServerLost(self.lost) from e
        except Exception as e:  # transport failures (httpx errors, closed anyio streams): the server is gone
            if type(e).__module__.split(".")[0] in {"httpx", "httpx2", "httpcore", "anyio"}:
                self.lost = f"MCP server {self.config.name!r} is unreachable: {_describe(e)}"
                raise ServerLost(self.lost) from e
            raise


def _describe(error: BaseException | None) -> str:
    if error is None:
        return "the server closed the connection during the handshake"
    if isinstance(error, BaseExceptionGroup):
        inner = error.exceptions[0] if error.exceptions else None
        return _describe(inner) if inner is not None else str(error)
    if isinstance(error, MCPError):
        return f"{error.message} (MCP error {error.code}); did the server exit at start?"
    return f"{type(error).__name__}: {error}"


# --------------------------------------------------------------------------- shared pool
class _Entry:
    __slots__ = ("conn", "refs")

    def __init__(self, conn: McpConnection):
        self.conn, self.refs = conn, 0


_POOL: dict[str, _Entry] = {}
_POOL_LOCK = threading.Lock()


def acquire_shared(config: ServerConfig) -> McpConnection:
    """The process's connection for ``config`` (started on first use, replaced if it was lost); counts a user.

    Each ``acquire_shared`` needs one :func:`release_shared`; the last release stops the server.
    """
    key = config.model_dump_json()
    with _POOL_LOCK:
        entry = _POOL.get(key)
        stale = None
        if entry is not None and not entry.conn.alive:
            stale, entry = entry.conn, None
            del _POOL[key]
        if entry is None:
            entry = _Entry(McpConnection(config).start())
            _POOL[key] = entry
        entry.refs += 1
    if stale is not None:
        stale.stop()
    return entry.conn


def release_shared(conn: McpConnection) -> None:
    """One user of a shared connection is done; the last one stops it (a lost one is stopped at once)."""
    key = conn.config.model_dump_json()
    stop = False
    with _POOL_LOCK:
        entry = _POOL.get(key)
        if entry is not None and entry.conn is conn:
            entry.refs -= 1
            if entry.refs <= 0:
                del _POOL[key]
                stop = True
        else:  # replaced after it was lost: nobody else holds it
            stop = True
    if stop:
        conn.stop()


def shared_pool_size() -> int:
    """How many shared connections are open (for tests and diagnostics)."""
    with _POOL_LOCK:
        return len(_POOL)


@atexit.register
def _stop_all() -> None:
    for conn in list(_LIVE):
        conn.stop()
