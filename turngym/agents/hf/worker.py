"""``HFProcessBackend``: the ``HFBackend`` scheduler and model in a worker process of their own.

    backend = HFProcessBackend("path/or/hub-id", device="cuda", dtype="bfloat16", max_batch_size=64)
    gen = await backend.generate(prompt_ids, SamplingParams(max_tokens=64), route="traj-3")

Why a process: an in-process ``HFBackend`` runs its forward passes in a thread of the caller's
process. On a GPU a forward pass of a small model is a few hundred kernel launches, each of which
releases and re-takes the GIL; while the rollout engine's event loop works (env steps, chat
templates, tokenizing), each re-take waits up to the interpreter's switch interval (5 ms), so the
GPU idles whenever the loop is busy. Here the model has its own interpreter and GIL (as vLLM's
engine core does); the caller's process only pickles requests and results through a pipe.

Same constructor arguments as ``HFBackend`` (the model must be a path or hub id), plus ``engine``
(``auto``, ``continuous`` or ``slots``: ``turngym.agents.hf.registry``) and ``max_context`` (the
slots' size), and the same behaviour: continuous batching, per-request seeds, raw logprobs, prefix reuse per ``route``.
``update_weights(state_dict)`` sends the tensors through ``torch.multiprocessing`` (CUDA tensors
as IPC handles, CPU tensors through shared memory). ``stats``, ``release``, ``share_prefix``,
``reset_prefix_cache``, ``start_trace``/``take_trace`` are forwarded. A caller that gives up
(cancelled, timed out) frees its row in the worker. If the worker dies, every pending and later call
raises ``BackendError`` with its exit code; ``aclose`` stops it. The worker freezes its heap (the
libraries and the model) out of the cyclic collector's full scans once it has loaded
(``turngym.core.heap``; ``frozen_objects`` says how many objects): a full scan of it stalls the
scheduler for a fifth of a second.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import threading
import traceback
from pathlib import Path
from typing import Any

from turngym.agents.backend import BackendError, Generation, SamplingParams, TokenBackend
from turngym.agents.hf.engine import HFBackend
from turngym.agents.hf.request import settle
from turngym.core.heap import freeze_heap

_START_TIMEOUT_S = 600.0  # loading a large model from a slow disk
_CALL_TIMEOUT_S = 600.0


class HFProcessBackend(TokenBackend):
    no_adapters = HFBackend.no_adapters

    def __init__(self, model: str | Path, tokenizer: Any = None, **kwargs: Any):
        import torch.multiprocessing as mp

        if not isinstance(model, (str, Path)):
            raise TypeError("HFProcessBackend loads the model in its worker: pass a path or hub id")
        if tokenizer is not None and not isinstance(tokenizer, (str, Path)):
            tokenizer = getattr(tokenizer, "name_or_path", None) or None
        self.model_name = str(model)
        ctx = mp.get_context("spawn")  # CUDA cannot be used in a forked child
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_worker, args=(child, str(model), tokenizer, kwargs), name="hf-backend", daemon=True
        )
        self._proc.start()
        child.close()
        self._send_lock = threading.Lock()
        self._ids = itertools.count()
        self._pending: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self._replies: dict[int, tuple[threading.Event, list]] = {}
        self._dead: str | None = None
        self.result_messages = 0  # "done" messages read from the worker (a decode block's results share one)
        if not self._conn.poll(_START_TIMEOUT_S):
            self._kill()
            raise BackendError(f"the HF backend worker did not start within {_START_TIMEOUT_S:.0f}s")
        kind, info = self._recv_or_fail()
        if kind != "ready":
            self._kill()
            raise BackendError(f"the HF backend worker failed to load {model!r}:\n{info}")
        self.device, self.vocab_size, self.fuse_tokens = (
            info["device"],
            info["vocab_size"],
            info["fuse_tokens"],
        )
        self.frozen_objects = info["frozen_objects"]  # the worker's heap frozen after loading (core.heap)
        self._reader = threading.Thread(target=self._read, name="hf-backend-reader", daemon=True)
        self._reader.start()

    # ------------------------------------------------------------- async API
    async def _generate(
        self, prompt_ids: list[int], sampling: SamplingParams, route: str | None, adapter: str | None
    ) -> Generation:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Generation] = loop.create_future()
        rid = next(self._ids)
        self._pending[rid] = (loop, fut)
        try:
            self._send(("gen", rid, list(prompt_ids), sampling, route))
            return await fut
        except asyncio.CancelledError:
            if self._dead is None:
                self._send(("cancel", rid), quiet=True)
            raise
        finally:
            self._pending.pop(rid, None)

    async def aclose(self) -> None:
        """Stop the worker; requests still running fail with ``BackendError``."""
        if self._proc.is_alive():
            self._send(("stop",), quiet=True)
            await asyncio.to_thread(self._proc.join, 30)
        self._kill()

    # -------------------------------------------------------------- sync API
    def update_weights(self, state_dict: dict[str, Any], strict: bool = True) -> None:
        """Load new weights into the worker's model between two decode steps (parked rows dropped)."""
        self._call("weights", state_dict, strict)

    def release(self, route: str) -> None:
        """The trajectory behind ``route`` is over: the worker drops its parked row."""
        self._send(("release", route), quiet=True)

    def share_prefix(self, route: str, child: str) -> None:
        """``child`` was forked from ``route``: its first request may start from a copy of ``route``'s
        row in the worker (sent ahead of the child's requests, on the same pipe)."""
        self._send(("share", route, child), quiet=True)

    def reset_prefix_cache(self) -> None:
        self._call("reset")

    def precapture(self, context: int | None = None, filtered: tuple[bool, ...] = (False,)) -> int:
        """The worker's slots engine captures its decode graphs now (``HFSlotBackend.precapture``;
        0 for an engine without graphs)."""
        return self._call("precapture", context, filtered)

    def start_trace(self) -> None:
        self._call("start_trace")

    def take_trace(self) -> list[tuple]:
        return self._call("take_trace")

    @property
    def stats(self) -> dict[str, Any]:
        return self._call("stats")

    @property
    def weights_version(self) -> int:
        return self._call("weights_version")

    # ------------------------------------------------------------- plumbing
    def _send(self, msg: tuple, quiet: bool = False) -> None:
        if self._dead is not None:
            if quiet:
                return
            raise BackendError(self._dead)
        try:
            with self._send_lock:
                self._conn.send(msg)
        except (OSError, EOFError, BrokenPipeError) as e:
            self._fail(f"the HF backend worker is gone ({type(e).__name__}: {e})")
            if not quiet:
                raise BackendError(self._dead) from e

    def _call(self, what: str, *args: Any) -> Any:
        """A synchronous request to the worker, answered through the reader thread."""
        cid = next(self._ids)
        event, box = threading.Event(), []
        self._replies[cid] = (event, box)
        try:
            self._send(("call", cid, what, args))
            if not event.wait(_CALL_TIMEOUT_S):
                raise BackendError(f"the HF backend worker did not answer {what!r}")
        finally:
            self._replies.pop(cid, None)
        ok, value = box[0]
        if not ok:
            raise BackendError(value)
        return value

    def _recv_or_fail(self) -> tuple:
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            self._proc.join(5)
            code = self._proc.exitcode
            return "error", (
                f"the worker exited (code {code}) before it was ready; its error is above. The worker "
                "is a spawned process, which imports the main module again: a script must create "
                "the backend under `if __name__ == '__main__':`"
            )

    def _read(self) -> None:
        """The reader thread: results and replies from the worker, until it goes away."""
        while True:
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):
                self._proc.join(5)
                self._fail(f"the HF backend worker exited (code {self._proc.exitcode})")
                return
            if msg[0] == "done":  # the results one scheduler iteration delivered: one hand-off a loop
                self.result_messages += 1
                by_loop: dict[asyncio.AbstractEventLoop, list] = {}
                for rid, result in msg[1]:
                    entry = self._pending.get(rid)
                    if entry is not None:
                        loop, fut = entry
                        by_loop.setdefault(loop, []).append(
                            (fut, BackendError(result) if isinstance(result, str) else result)
                        )
                for loop, settled in by_loop.items():
                    _deliver(loop, settled)
            elif msg[0] == "reply":
                _, cid, ok, value = msg
                waiter = self._replies.get(cid)
                if waiter is not None:
                    waiter[1].append((ok, value))
                    waiter[0].set()

    def _fail(self, why: str) -> None:
        """The worker is gone: fail everything pending, and every later call, with ``why``."""
        if self._dead is None:
            self._dead = why
        for loop, fut in list(self._pending.values()):
            _deliver(loop, [(fut, BackendError(why))])
        for event, box in list(self._replies.values()):
            box.append((False, why))
            event.set()

    def _kill(self) -> None:
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
        self._fail("the HF backend was closed")
        self._conn.close()


def _deliver(loop: asyncio.AbstractEventLoop, settled: list[tuple[asyncio.Future, Any]]) -> None:
    """Resolve the futures of one event loop with their results, in one thread-safe hand-off."""
    try:
        loop.call_soon_threadsafe(_settle_all, settled)
    except RuntimeError:  # that event loop is closed: nobody is waiting any more
        pass


def _settle_all(settled: list[tuple[asyncio.Future, Any]]) -> None:
    for fut, result in settled:
        settle(fut, result)


class _Outbox:
    """The worker's finished results on their way to the parent. The scheduler thread's deliveries
    wait for the end of its retire or iteration (``HFBackend.on_iteration`` calls ``flush``), so a
    decode block that ends many rows sends them in one message: one pipe write here, one read and one
    event-loop hand-off in the parent, instead of one each a row. A result delivered from any other
    thread (a refusal, a cancellation) goes out at once."""

    def __init__(self, send: Any, scheduler: Any):
        self._send, self._scheduler = send, scheduler
        self._items: list[tuple[int, Any]] = []
        self._lock = threading.Lock()

    def put(self, rid: int, result: Any) -> None:
        with self._lock:
            self._items.append((rid, result))
        if threading.current_thread() is not self._scheduler():
            self.flush()

    def flush(self) -> None:
        with self._lock:
            items, self._items = self._items, []
        if items:
            try:
                self._send(items)
            except (OSError, EOFError, BrokenPipeError):  # the parent is gone: the worker stops
                pass


# ----------------------------------------------------------------------- worker
def _worker(conn: Any, model: str, tokenizer: str | None, kwargs: dict) -> None:
    """The worker process: an HF backend (``engine``, see ``turngym.agents.hf.registry``) fed from
    the pipe; results go back as they finish."""
    try:
        from turngym.agents.hf.registry import make_hf_backend
        from turngym.agents.models import load_tokenizer

        backend = make_hf_backend(model, load_tokenizer(tokenizer or model), **kwargs)
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(("error", traceback.format_exc()))
        return
    freeze_heap()  # the model and libraries, out of the collector's full scans (they stall the scheduler)
    conn.send(
        (
            "ready",
            {
                "device": str(backend.device),
                "vocab_size": backend.vocab_size,
                "fuse_tokens": backend.fuse_tokens,
                "frozen_objects": gc.get_freeze_count(),
            },
        )
    )
    send_lock = threading.Lock()
    cancelled: set[int] = set()
    outbox = _Outbox(lambda results: send(("done", results)), lambda: backend.scheduler_thread)
    backend.on_iteration = outbox.flush

    def send(msg: tuple) -> None:
        with send_lock:
            conn.send(msg)

    def done_for(rid: int):
        def done(result: Generation | BaseException) -> None:
            cancelled.discard(rid)
            outbox.put(rid, result if isinstance(result, Generation) else str(result))

        return done

    calls = {
        "weights": backend.update_weights,
        "reset": backend.reset_prefix_cache,
        "precapture": getattr(backend, "precapture", lambda *a: 0),
        "start_trace": backend.start_trace,
        "take_trace": backend.take_trace,
        "stats": lambda: dict(backend.stats),
        "weights_version": lambda: backend.weights_version,
    }
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            break
        kind = msg[0]
        if kind == "gen":
            _, rid, prompt, sampling, route = msg
            try:
                backend.submit(
                    prompt, sampling, done_for(rid), route=route, gave_up=lambda r=rid: r in cancelled
                )
            except BackendError as e:  # refused here, outside the scheduler thread: it goes out at once
                outbox.put(rid, str(e))
        elif kind == "cancel":
            cancelled.add(msg[1])
        elif kind == "release":
            backend.release(msg[1])
        elif kind == "share":
            backend.share_prefix(msg[1], msg[2])
        elif kind == "call":
            _, cid, what, args = msg
            try:
                send(("reply", cid, True, calls[what](*args)))
            except Exception as e:  # noqa: BLE001 - the caller gets it as a BackendError
                send(("reply", cid, False, f"{type(e).__name__}: {e}"))
        elif kind == "stop":
            break
    asyncio.run(backend.aclose())
