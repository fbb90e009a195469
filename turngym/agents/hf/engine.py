"""``HFBackend``: transformers in-process (CPU or GPU) with continuous batching of concurrent requests.

    backend = HFBackend("tiny", max_batch_size=64)
    gen = await backend.generate(prompt_ids, SamplingParams(max_tokens=64, temperature=0, seed=7))

This is the engine's front end and busy loop: requests come in (``submit``, ``generate``,
``generate_batch``), a scheduler thread owns the model and runs one scheduler iteration after
another (admit the arrivals, one pass or decode block, retire the finished), and results go back.
What an iteration does is the scheduler's (``scheduler.continuous`` here, ``scheduler.slots`` for
``HFSlotBackend``), which plans passes over its KV manager (``kv``) for its runner (``runner``).

* A long generation never holds a short one back; a new request waits at most one step.
* Prefix reuse per trajectory: a finished request with a ``route`` stays *parked*, its KV kept for
  the route's next turn, until ``release(route)``, ``park_s`` seconds, eviction for room,
  ``update_weights`` or ``reset_prefix_cache()``; ``share_prefix(route, child)`` lets a fork's first
  request start from a copy of ``route``'s row. ``reuse_prefix=False`` turns it off.
* Sampling settings and seeds are per request (``sampling``); logprobs are the raw model's.
* ``update_weights(state_dict)`` takes the model lock, so it lands between two steps;
  ``Generation.meta["weights_version"]`` is ``[first, last]`` of a generation's tokens.
* ``stats`` counts passes, compactions, prompt tokens fed and reused, parked rows dropped, batch
  widths and idle seconds; ``start_trace()``/``take_trace()`` record a timeline of passes
  (``("pass", start, end, kind, rows, joiners, width, cache_len, cpu_s, fwd_s)``), idle waits and
  finished requests, which ``benchmarks/rollout.py`` turns into a latency breakdown.

``turngym.agents.hf.worker.HFProcessBackend`` runs an engine in a worker process with its own GIL.
Design notes and measurements: docs/engines.md.
"""

from __future__ import annotations

import asyncio
import operator
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from turngym.agents.backend import BackendError, Generation, SamplingParams, TokenBackend
from turngym.agents.hf.kv.padded import PaddedKV
from turngym.agents.hf.request import Request, backend_error, once, release_cuda_cache, result, settle
from turngym.agents.hf.runner.eager import EagerRunner, attention_kernels, default_fuse_tokens
from turngym.agents.hf.scheduler.continuous import ContinuousScheduler

_STOP = object()  # tells the scheduler thread to exit


class HFBackend(TokenBackend):
    no_adapters = "HFBackend serves one set of weights; use update_weights() instead of adapters"

    def __init__(
        self,
        model: str | Path | Any,
        tokenizer: Any = None,
        *,
        device: str | None = None,
        dtype: Any = None,
        max_batch_size: int = 32,
        max_wait_ms: float = 5.0,
        attn_implementation: str | None = None,
        fuse_tokens: int | None = None,
        reuse_prefix: bool = True,
        park_s: float = 10.0,
        cudnn_attention: bool = False,
    ):
        from turngym.agents.models import load_model, load_tokenizer

        if isinstance(model, (str, Path)):
            self.tokenizer = tokenizer or load_tokenizer(model)
            self.model = load_model(
                model, device=device, dtype=dtype, attn_implementation=attn_implementation
            )
        else:
            if tokenizer is None:
                raise ValueError("pass the tokenizer along with a model object")
            self.model, self.tokenizer = model, tokenizer
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.device = next(self.model.parameters()).device
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.tokenizer.eos_token_id
        self.vocab_size = self.model.get_input_embeddings().num_embeddings
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_ms / 1000  # an idle scheduler waits this long to gather a first batch
        if fuse_tokens is None:  # see runner.eager.default_fuse_tokens
            fuse_tokens = default_fuse_tokens(self.model, self.device)
        self.fuse_tokens = fuse_tokens
        self.reuse_prefix, self.park_s = reuse_prefix, park_s
        self.kernels = attention_kernels(self.device, cudnn_attention)
        self.weights_version = 0
        self.epoch = 0  # bumped by reset_prefix_cache: rows parked before it are dropped
        self.released: set[str] = set()  # routes whose trajectories ended (see release)
        self.donors: dict[str, str] = {}  # a forked route -> the route whose row it may copy (share_prefix)
        self.trace: list[tuple] | None = None  # a timeline when set to a list, see the module doc
        self.stats: dict[str, Any] = {
            "prefills": 0,  # prefill-only passes
            "fused": 0,  # decode passes that also prefilled joiners
            "steps": 0,  # decode passes
            "compactions": 0,
            "prompt_tokens": 0,  # prompt tokens fed to the model
            "reused_tokens": 0,  # prompt tokens whose KV came from a parked row instead
            "parked_dropped": 0,  # parked rows dropped unused (released, expired, stale, evicted for room)
            # of those, rows of live routes evicted to make room for another request: that route's next
            # turn is prefilled in full (more trajectories at once than rows; a trajectory's end is a release)
            "parked_evicted": 0,
            "shared_rows": 0,  # first requests of forked routes that started from a copy of their donor's row
            "widths": Counter(),  # decode passes by batch width
            "idle_s": 0.0,  # seconds the scheduler thread waited with nothing to run
        }
        self.lock = threading.Lock()
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()
        # called by the scheduler thread after each retire, iteration and when it stops: the results
        # delivered since can go out together (``HFProcessBackend``'s worker sends them in one message)
        self.on_iteration: Callable[[], None] | None = None
        # the engine's parts: a scheduler over its KV manager and runner (HFSlotBackend composes others)
        self.scheduler: Any = ContinuousScheduler(self, PaddedKV(self.device), EagerRunner(self))

    # ------------------------------------------------------------- async API
    async def _generate(
        self, prompt_ids: list[int], sampling: SamplingParams, route: str | None, adapter: str | None
    ) -> Generation:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Generation] = loop.create_future()

        def done(result: Generation | BaseException) -> None:
            loop.call_soon_threadsafe(settle, fut, result)

        self.submit(prompt_ids, sampling, done, route=route, gave_up=fut.done)
        return await fut

    def submit(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        done: Callable[[Generation | BaseException], None],
        *,
        route: str | None = None,
        gave_up: Callable[[], bool] = lambda: False,
    ) -> None:
        """Queue a request from any thread; ``done`` is called from the scheduler thread with the
        generation or a ``BackendError``. Bad prompts raise ``BackendError`` here."""
        req = self._request(prompt_ids, sampling, done, gave_up)
        req.route = route
        self._ensure_thread()
        self._inbox.put(req)

    def start_trace(self) -> None:
        """Record a timeline from now on (see the module doc); ``take_trace`` returns and clears it."""
        self.trace = []

    def take_trace(self) -> list[tuple]:
        out, self.trace = self.trace or [], [] if self.trace is not None else None
        return out

    async def aclose(self) -> None:
        """Stop the scheduler thread; requests still queued or running fail with ``BackendError``."""
        th = self._thread
        if th is not None and th.is_alive():
            self._inbox.put(_STOP)
            await asyncio.to_thread(th.join)
        self._thread = None

    # -------------------------------------------------------------- sync API
    def generate_batch(self, prompts: list[list[int]], samplings: list[SamplingParams]) -> list[Generation]:
        """Generate for several prompts, continuously batched, in the calling thread."""
        if len(prompts) != len(samplings):
            raise ValueError("one SamplingParams per prompt")
        results: list[Generation | BaseException | None] = [None] * len(prompts)

        def setter(i: int) -> Callable[[Generation | BaseException], None]:
            return lambda r: results.__setitem__(i, r)

        pairs = enumerate(zip(prompts, samplings, strict=True))
        waiting = [self._request(p, s, setter(i)) for i, (p, s) in pairs]
        batch = self.scheduler.new_batch()
        while waiting or batch.rows:
            room = self.max_batch_size - len(batch.rows)
            joiners, waiting = waiting[:room], waiting[room:]
            self.scheduler.iterate(batch, joiners)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return results  # type: ignore[return-value]

    def update_weights(self, state_dict: dict[str, Any], strict: bool = True) -> None:
        """Load new weights into the live model, between two decode steps (parked rows' KV, computed
        with the old weights, is dropped)."""
        with self.lock:
            self.model.load_state_dict(state_dict, strict=strict)
            self.weights_version += 1

    def release(self, route: str) -> None:
        """The trajectory behind ``route`` is over: its parked row is dropped at the next iteration
        (the rollout engine calls this, through ``LLMSession.end``, when a trajectory ends)."""
        self.released.add(route)
        self.donors.pop(route, None)

    def share_prefix(self, route: str, child: str) -> None:
        """``child`` was forked from ``route`` (a tree rollout's branch: the same tokens so far): its
        first request may start from a copy of ``route``'s row instead of a full prefill."""
        if route != child:
            self.donors[child] = route

    def reset_prefix_cache(self) -> None:
        """Drop every parked row (e.g. after changing the model's weights in place, not through
        ``update_weights``); the next turn of their routes is prefilled in full."""
        self.epoch += 1

    # ------------------------------------------------------------- scheduler
    def _request(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        done: Callable[[Generation | BaseException], None],
        gave_up: Callable[[], bool] = lambda: False,
    ) -> Request:
        import torch

        if not prompt_ids:
            raise BackendError("empty prompt")
        try:  # C-level passes: a 2k-token prompt is checked in tens of microseconds
            ids = list(map(operator.index, prompt_ids))
        except TypeError as e:
            raise BackendError(f"prompt token ids must be integers: {e}") from e
        if min(ids) < 0 or max(ids) >= self.vocab_size:
            bad = [t for t in ids if not 0 <= t < self.vocab_size]
            raise BackendError(f"prompt token ids outside the vocabulary (size {self.vocab_size}): {bad[:5]}")
        seed = sampling.seed if sampling.seed is not None else int(torch.randint(0, 2**62, ()).item())
        stops = frozenset(sampling.stop_token_ids) or frozenset({self.tokenizer.eos_token_id})
        req = Request(ids, sampling, once(done), gave_up, seed, stops)
        req.submitted = time.perf_counter()
        return req

    def _ensure_thread(self) -> None:
        with self._thread_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="hf-backend", daemon=True)
                self._thread.start()

    def _serve(self) -> None:
        """The scheduler thread: admit arrivals between decode steps until told to stop."""
        try:
            if self.device.type == "cuda":
                # CUDA's current device is per thread and a new thread starts on device 0: a rank whose
                # model lives on cuda:1 would launch Triton kernels and capture graphs on the wrong card
                import torch

                torch.cuda.set_device(self.device)
            self._serve_batches()
        finally:
            self.iteration_done()

    def iteration_done(self) -> None:
        hook = self.on_iteration
        if hook is not None:
            hook()

    def _serve_batches(self) -> None:
        batch = self.scheduler.new_batch()
        while (joiners := self._arrivals(batch)) is not None:
            try:
                self.scheduler.iterate(batch, joiners)
            except Exception as e:  # noqa: BLE001 - outside a pass (merging caches, compacting): the
                # batch may be half-changed, so every live row and joiner gets the error, the thread lives
                err = backend_error(e)
                for r in [*batch.rows, *joiners]:
                    if r.parked is None:
                        r.done(err)
                batch = self.scheduler.new_batch()
                release_cuda_cache()
            self.iteration_done()
        err = BackendError("the HF backend was closed")
        for r in batch.rows:
            if r.parked is None:
                r.done(err)
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                item.done(err)

    def _arrivals(self, batch: Any) -> list[Request] | None:
        """Requests to admit now (None: stop). With no active row, block for one (or until the oldest
        parked row expires), then gather more for ``max_wait``."""
        joiners: list[Request] = []
        deadline = None
        active = batch.active
        if not active:
            oldest = min((r.parked for r in batch.rows if r.parked is not None), default=None)
            timeout = None if oldest is None else max(0.0, oldest + self.park_s - time.perf_counter())
            t0 = time.perf_counter()
            try:
                item = self._inbox.get(timeout=timeout)
            except queue.Empty:
                item = None  # a parked row expired: the next iteration drops it
            t1 = time.perf_counter()
            self.stats["idle_s"] += t1 - t0
            if self.trace is not None:
                self.trace.append(("idle", t0, t1))
            if item is _STOP:
                return None
            if item is None:
                return joiners
            joiners.append(item)
            deadline = time.monotonic() + self.max_wait_s
        while active + len(joiners) < self.max_batch_size:
            remaining = 0.0 if deadline is None else deadline - time.monotonic()
            try:
                item = self._inbox.get(timeout=remaining) if remaining > 0 else self._inbox.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                for r in joiners:
                    r.done(BackendError("the HF backend was closed"))
                return None
            joiners.append(item)
        return joiners

    # ------------------------------------------------------------- parts
    @property
    def scheduler_thread(self) -> threading.Thread | None:
        """The thread that runs the scheduler (None before the first request)."""
        return self._thread

    def take_released(self) -> set[str]:
        """The routes released since the last call (their parked rows are dropped now)."""
        released, self.released = self.released, set()
        return released

    def may_resume(self, r: Request, released: set[str], now: float) -> bool:
        """Whether a parked row may still serve its route: not released, expired (``park_s``), or
        holding KV of older weights or an older prefix-cache epoch, and prefix reuse on."""
        stale = r.epoch != self.epoch or r.versions[-1] != self.weights_version
        return not (stale or r.route in released or not self.reuse_prefix or now - r.parked > self.park_s)

    def deliver(self, r: Request, park: bool) -> bool:
        """Answer a finished request (and trace it); park its row when it has a route (True: the
        row stays, its KV kept for the route's next turn)."""
        if self.trace is not None:
            t = time.perf_counter()
            self.trace.append(("req", r.route, r.submitted, r.admitted, t, len(r.prompt_ids), len(r.tokens)))
        res = result(r, self.tokenizer)
        parked = park and r.route is not None
        if parked:  # before the caller hears back: a reset_prefix_cache() it then calls must see this row
            r.parked, r.epoch, r.generator = time.perf_counter(), self.epoch, None
        r.done(res)
        return parked
