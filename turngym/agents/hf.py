"""``HFBackend``: transformers in-process (CPU or GPU) with continuous batching of concurrent requests.

    backend = HFBackend("tiny", max_batch_size=64)
    gen = await backend.generate(prompt_ids, SamplingParams(max_tokens=64, temperature=0, seed=7))

A scheduler thread owns the model. Requests join and leave the running batch between decode steps:
each iteration admits the requests that arrived, runs one decode step for every live row and retires
the rows that hit their own stop token or ``max_tokens`` (or whose caller gave up). The running batch
is one padded KV cache with a 2-D attention mask; its layers grow in place (buffers with spare
columns) instead of concatenating a copy of the whole cache every step. Joiners are prefilled in
the same forward pass as the decode step (their prompts right-aligned with the running rows' next
tokens) when the padding that adds fits ``fuse_tokens`` (default on CUDA: what costs about one
pass's kernel launches in FLOPs, ~26k tokens for a 76M model, ~300 for 7B; 0 on CPU, where a pass
costs its FLOPs); otherwise they get a left-padded prefill pass of their own and their cache is
merged in. Padding is trimmed as rows leave, and the cache is compacted (every row's tokens
right-aligned) once more than half of it is padding. A long generation therefore never holds a
short one back, and a new request waits at most one decode step, not a whole batch.
(transformers' own ``ContinuousBatchingManager`` is not used: it samples every request from one
global RNG with the batch's shared settings and reports logprobs after temperature/top-k/top-p,
while RL needs per-request seeds and settings and the raw model logprobs.)

* **Prefix reuse per trajectory.** A finished request with a ``route`` (the rollout engine passes
  one per trajectory) stays in the batch as a *parked* row holding its KV cache (prompt and
  generation). When the route's next request arrives and its prompt extends those ids (the
  next turn: the same context, the generation, the observation), the row resumes and feeds only
  the new tokens; a prompt that diverges reuses its common prefix (the row's later columns are
  masked out). Parked rows feed nothing, are dropped when the trajectory ends (``release(route)``),
  after ``park_s`` seconds, when their space is needed for new rows (oldest first), after
  ``update_weights`` or ``reset_prefix_cache()`` (their KV came from the old weights), and never
  serve another route, with one exception: ``share_prefix(route, child)`` (a tree rollout's branch,
  ``LLMSession.fork``) lets ``child``'s first request start from a *copy* of ``route``'s row (parked
  or running) and feed only the prompt after their common prefix (``stats["shared_rows"]``).
  ``reuse_prefix=False`` turns it off.
* On CUDA the passes run SDPA without cuDNN's attention kernel (``cudnn_attention=True`` allows
  it; torch's process-wide flag is off while passes run and restored after the last). cuDNN
  builds an execution plan for every new (batch, query, key) shape, ~4 ms of host time per layer,
  and a continuous batch meets a new shape nearly every pass: on an H100 a 12-layer 76M model's
  decode step took 46-50 ms on new shapes and 8 ms on seen ones, against 12-13 ms
  shape-independent without cuDNN (``benchmarks/gpu_results.md``).
* Sampling settings are per request and mixed freely in one batch (greedy rows take the argmax).
* Per-request seeds: every request samples from its own ``torch.Generator`` (seeded by
  ``SamplingParams.seed``, else from torch's global RNG), one exponential race per token, so the
  same seed gives the same sample whatever else is in the batch (tested).
* Logprobs are the raw model log-probabilities of the sampled tokens (temperature 1, before top-k/p).
  Under greedy decoding a request batched with others gives the ids of the same request alone.
* ``update_weights(state_dict)`` takes the model lock, so it lands between two decode steps; rows in
  flight continue on the new weights. ``Generation.meta["weights_version"]`` is ``[first, last]``:
  the weight versions of a generation's first and last token (equal unless an update landed mid-way).
  Whoever changes the model's weights in place some other way calls ``reset_prefix_cache()``.

On a GPU the scheduler thread's kernel launches each release and re-take the GIL, so a busy event
loop in the same process slows every pass; ``turngym.agents.hf_process.HFProcessBackend`` runs this
backend in a worker process instead.

``generate_batch`` is the synchronous API (it runs the same scheduler in the calling thread);
``submit`` queues a request with a callback from any thread. ``stats`` counts forward passes
(prefill-only, decode, fused), cache compactions, prompt tokens fed and reused, parked rows dropped,
the histogram of batch widths and the seconds the scheduler thread sat idle (``idle_s``).
``start_trace()`` records a timeline (``time.perf_counter`` seconds) that ``take_trace()`` returns:
every forward pass ``("pass", start, end, kind, rows, joiners, width, cache_len, cpu_s, fwd_s)``
(a decode pass of the slots engine appends the steps of its block)
(``cpu_s``: the scheduler thread's CPU time in it: on a GPU, wall time well above it is time spent
waiting, for the GIL or the device; ``fwd_s``: the seconds until the model call returned, which on a
GPU is the host's time to queue the pass's kernels: near the whole pass, the host is the bottleneck;
far below it, the device), every idle wait
``("idle", start, end)`` and every finished request ``("req", route, submitted, admitted, done,
prompt_len, tokens)``; ``benchmarks/rollout.py`` turns it into a latency breakdown.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import operator
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from turngym.agents.backend import BackendError, Generation, SamplingParams, TokenBackend

_STOP = object()  # tells the scheduler thread to exit


@dataclass(eq=False)
class _Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    done: Callable[[Generation | BaseException], None]
    gave_up: Callable[[], bool] = lambda: False
    seed: int = 0
    stops: frozenset[int] = frozenset()
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    route: str | None = None
    submitted: float = 0.0  # perf_counter when the caller asked
    admitted: float = 0.0  # start of the pass that prefilled it
    first_token: float = 0.0  # when that pass sampled its first token
    generator: Any = None  # made at admission, for sampled (non-greedy) requests only
    reuse: int = 0  # leading prompt tokens whose KV came from the route's parked row
    parked: float | None = None  # when the finished row was parked (its KV kept for the route's next turn)
    epoch: int = 0  # the prefix-cache epoch it was parked in

    @property
    def finished(self) -> bool:
        return len(self.tokens) >= self.sampling.max_tokens or (
            bool(self.tokens) and self.tokens[-1] in self.stops
        )

    @property
    def cached_ids(self) -> list[int]:
        """The ids whose KV a finished row holds: the prompt and every sampled token but the last."""
        return self.prompt_ids + self.tokens[:-1]


@dataclass
class _Batch:
    """Rows of one left-padded KV cache: its attention mask, each row's next position and next input.
    A parked row (finished, kept for its route's next turn) feeds nothing until it is resumed."""

    rows: list[_Request] = field(default_factory=list)
    cache: Any = None
    mask: Any = None  # [B, T] long, 0 on padding and on columns a row did not feed
    pos: Any = None  # [B] position id of the row's next token
    pending: Any = None  # [B] last sampled token, not yet in the cache

    @property
    def active(self) -> int:
        return sum(r.parked is None for r in self.rows)


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
        if fuse_tokens is None:  # see _default_fuse_tokens
            fuse_tokens = _default_fuse_tokens(self.model, self.device)
        self.fuse_tokens = fuse_tokens
        self.reuse_prefix, self.park_s = reuse_prefix, park_s
        self._kernels = _attention_kernels(self.device, cudnn_attention)
        self.weights_version = 0
        self._epoch = 0  # bumped by reset_prefix_cache: rows parked before it are dropped
        self._released: set[str] = set()  # routes whose trajectories ended (see release)
        self._donors: dict[str, str] = {}  # a forked route -> the route whose row it may copy (share_prefix)
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
        self._lock = threading.Lock()
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()
        # called by the scheduler thread after each retire, iteration and when it stops: the results
        # delivered since can go out together (``HFProcessBackend``'s worker sends them in one message)
        self.on_iteration: Callable[[], None] | None = None

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
        batch = self._new_batch()
        while waiting or batch.rows:
            room = self.max_batch_size - len(batch.rows)
            joiners, waiting = waiting[:room], waiting[room:]
            self._iterate(batch, joiners)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return results  # type: ignore[return-value]

    def update_weights(self, state_dict: dict[str, Any], strict: bool = True) -> None:
        """Load new weights into the live model, between two decode steps (parked rows' KV, computed
        with the old weights, is dropped)."""
        with self._lock:
            self.model.load_state_dict(state_dict, strict=strict)
            self.weights_version += 1

    def release(self, route: str) -> None:
        """The trajectory behind ``route`` is over: its parked row is dropped at the next iteration
        (the rollout engine calls this, through ``LLMSession.end``, when a trajectory ends)."""
        self._released.add(route)
        self._donors.pop(route, None)

    def share_prefix(self, route: str, child: str) -> None:
        """``child`` was forked from ``route`` (a tree rollout's branch: the same tokens so far): its
        first request may start from a copy of ``route``'s row instead of a full prefill."""
        if route != child:
            self._donors[child] = route

    def reset_prefix_cache(self) -> None:
        """Drop every parked row (e.g. after changing the model's weights in place, not through
        ``update_weights``); the next turn of their routes is prefilled in full."""
        self._epoch += 1

    # ------------------------------------------------------------- scheduler
    def _request(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        done: Callable[[Generation | BaseException], None],
        gave_up: Callable[[], bool] = lambda: False,
    ) -> _Request:
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
        req = _Request(ids, sampling, _once(done), gave_up, seed, stops)
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
            self._serve_batches()
        finally:
            self._iteration_done()

    def _iteration_done(self) -> None:
        hook = self.on_iteration
        if hook is not None:
            hook()

    def _serve_batches(self) -> None:
        batch = self._new_batch()
        while (joiners := self._arrivals(batch)) is not None:
            try:
                self._iterate(batch, joiners)
            except Exception as e:  # noqa: BLE001 - outside a pass (merging caches, compacting): the
                # batch may be half-changed, so every live row and joiner gets the error, the thread lives
                err = _backend_error(e)
                for r in [*batch.rows, *joiners]:
                    if r.parked is None:
                        r.done(err)
                batch = self._new_batch()
                _release_cuda_cache()
            self._iteration_done()
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

    def _new_batch(self) -> Any:
        """The scheduler's empty running batch (a subclass may keep its rows differently)."""
        return _Batch()

    def _arrivals(self, batch: _Batch) -> list[_Request] | None:
        """Requests to admit now (None: stop). With no active row, block for one (or until the oldest
        parked row expires), then gather more for ``max_wait``."""
        joiners: list[_Request] = []
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

    def _iterate(self, batch: _Batch, joiners: list[_Request]) -> None:
        """One scheduler iteration: place the joiners (see ``_plan``), one forward pass for every row
        that feeds, retire the finished.

        Fresh joiners are prefilled in the same pass as the other rows' decode step when the padding
        that costs (rows x longest prompt) fits ``fuse_tokens``; otherwise in a prefill pass of their
        own, merged in after."""
        joiners = [r for r in joiners if not r.gave_up()]
        resumes, fresh = self._plan(batch, joiners)
        fuse = bool(fresh and batch.rows)
        if fuse:
            width = max(len(r.prompt_ids) for r in fresh)
            fuse = len(batch.rows) * (width - 1) <= self.fuse_tokens
        if fresh and not fuse:
            self._admit(batch, fresh)
        fused = fresh if fuse else []
        if not (batch.active or resumes or fused):  # fused joiners may join a batch of parked rows
            return
        try:
            self._pass(batch, resumes, fused)
        except Exception as e:  # noqa: BLE001 - every live row gets the error, the thread survives
            err = _backend_error(e)
            for r in [*batch.rows, *resumes.values(), *fused]:
                if r.parked is None:
                    r.done(err)
            batch.__init__()  # type: ignore[misc]
            return
        self._retire(batch)
        self._compact(batch)

    def _plan(self, batch: _Batch, joiners: list[_Request]) -> tuple[dict[int, _Request], list[_Request]]:
        """Give each joiner a row: its route's parked row when the prompt extends what that row holds
        (it then feeds only the prompt after the reused prefix), else a fresh row. Parked rows that
        expired (``park_s``), were released, hold KV of older weights or an older
        ``reset_prefix_cache`` epoch, lost their route's reuse, or are the oldest when fresh rows
        need room, are dropped.

        Resuming is skipped (all joiners fresh) when the padding it costs the other rows exceeds
        ``fuse_tokens`` plus the prompt tokens it saves. Returns (row index -> request, fresh)."""
        now = time.perf_counter()
        released, self._released = self._released, set()
        parked: dict[str | None, int] = {}
        drop: set[int] = set()
        for i, r in enumerate(batch.rows):
            if r.parked is None:
                continue
            stale = r.epoch != self._epoch or r.versions[-1] != self.weights_version
            if stale or r.route in released or not self.reuse_prefix or now - r.parked > self.park_s:
                drop.add(i)
            else:
                parked[r.route] = i
        resumes: dict[int, _Request] = {}
        fresh: list[_Request] = []
        for r in joiners:
            i = parked.pop(r.route, None) if r.route is not None else None
            if i is not None:
                r.reuse = min(_common_prefix(batch.rows[i].cached_ids, r.prompt_ids), len(r.prompt_ids) - 1)
                if r.reuse > 0:
                    resumes[i] = r
                    continue
                drop.add(i)
            fresh.append(r)
        if resumes:
            width = max(len(r.prompt_ids) - r.reuse for r in resumes.values())
            padding = (len(batch.rows) - len(resumes)) * (width - 1)
            if padding > self.fuse_tokens + sum(r.reuse for r in resumes.values()):
                for r in resumes.values():
                    r.reuse = 0
                drop.update(resumes)
                fresh += resumes.values()
                resumes = {}
        unclaimed = sorted((batch.rows[i].parked, i) for i in parked.values() if i not in drop)
        over = len(batch.rows) - len(drop) + len(fresh) - self.max_batch_size
        evicted = [i for _, i in unclaimed[: max(0, over)]]
        self.stats["parked_evicted"] += len(evicted)
        drop.update(evicted)
        if drop:
            keep = [i for i in range(len(batch.rows)) if i not in drop]
            self.stats["parked_dropped"] += len(drop)
            self._keep(batch, keep)
            new_index = {old: j for j, old in enumerate(keep)}
            resumes = {new_index[i]: r for i, r in resumes.items()}
        if self._donors and self.reuse_prefix and fresh:
            fresh = self._share(batch, resumes, fresh)
        for i, r in resumes.items():
            if r.reuse < len(batch.rows[i].cached_ids):  # the prompt diverges: mask the row's later tokens
                m = batch.mask[i]
                batch.mask[i] = m * (m.cumsum(0) <= r.reuse)
        return resumes, fresh

    def _share(self, batch: _Batch, resumes: dict[int, _Request], fresh: list[_Request]) -> list[_Request]:
        """Fresh requests of forked routes (``share_prefix``) whose donor route has a row in the batch
        (parked or running, KV of the current weights) get a copy of that row and resume it like a
        parked row of their own (added to ``resumes``); returns the others."""
        import torch

        rows = {r.route: i for i, r in enumerate(batch.rows) if r.route is not None}
        rest = []
        for r in fresh:
            src = self._donors.pop(r.route, None) if r.route is not None else None
            i = rows.get(src) if src is not None else None
            donor = batch.rows[i] if i is not None else None
            if donor is None or not donor.versions or donor.versions[-1] != self.weights_version:
                rest.append(r)
                continue
            if donor.parked is not None and donor.epoch != self._epoch:
                rest.append(r)
                continue
            reuse = min(_common_prefix(donor.cached_ids, r.prompt_ids), len(r.prompt_ids) - 1)
            if reuse <= 0:
                rest.append(r)
                continue
            idx = torch.tensor([i], device=self.device)
            for layer in batch.cache.layers:
                layer.keys = torch.cat([layer.keys, layer.keys[idx]])
                layer.values = torch.cat([layer.values, layer.values[idx]])
            batch.mask = torch.cat([batch.mask, batch.mask[idx]])
            batch.pos = torch.cat([batch.pos, batch.pos[idx]])
            batch.pending = torch.cat([batch.pending, batch.pending[idx]])
            holder = copy.copy(donor)  # stands for the copied row until ``_pass`` puts ``r`` there
            holder.tokens, holder.route = list(donor.tokens), r.route
            holder.parked = holder.parked if holder.parked is not None else time.perf_counter()
            batch.rows.append(holder)
            r.reuse = reuse
            resumes[len(batch.rows) - 1] = r
            self.stats["shared_rows"] += 1
        return rest

    def _admit(self, batch: _Batch, joiners: list[_Request]) -> None:
        """Prefill the joiners in a pass of their own and merge them in; a failing group is retried
        one by one so only the culprit fails."""
        part = _Batch()
        try:
            self._pass(part, {}, joiners)
        except Exception as e:  # noqa: BLE001
            if len(joiners) > 1:
                for r in joiners:
                    self._admit(batch, [r])
                return
            joiners[0].done(_backend_error(e))
            return
        self._retire(part)
        self._merge(batch, part)

    def _pass(self, batch: _Batch, resumes: dict[int, _Request], joiners: list[_Request]) -> None:
        """One forward pass. Running rows feed their pending token, resumed rows (index -> request)
        their prompt after the reused prefix, joiners (new rows, empty cache) their whole prompt,
        all right-aligned in one window; parked rows feed nothing. Where a row fed nothing its new
        columns are masked (``_compact`` removes them). On an empty batch this is a prefill."""
        import torch

        dev, rows = self.device, len(batch.rows)
        for i, r in resumes.items():
            batch.rows[i] = r
        feeds = {i: (r.prompt_ids[r.reuse :], r.reuse) for i, r in resumes.items()}
        feeds.update({rows + j: (r.prompt_ids, 0) for j, r in enumerate(joiners)})
        n, width = rows + len(joiners), max([1, *(len(f) for f, _ in feeds.values())])
        running = [i for i, r in enumerate(batch.rows) if r.parked is None and i not in feeds]
        if len(running) == n:  # a plain decode step
            ids, fed, pos = batch.pending[:, None], torch.ones_like(batch.mask[:, :1]), batch.pos[:, None]
        else:
            ids = torch.full((n, width), self.pad_id, dtype=torch.long)
            fed = torch.zeros((n, width), dtype=torch.long)
            pos = torch.zeros((n, width), dtype=torch.long)
            for i, (f, start) in feeds.items():
                ids[i, width - len(f) :] = torch.tensor(f, dtype=torch.long)
                fed[i, width - len(f) :] = 1
                pos[i, width - len(f) :] = torch.arange(start, start + len(f))
            ids, fed, pos = ids.to(dev), fed.to(dev), pos.to(dev)
            if running:
                idx = torch.tensor(running, device=dev)
                ids[idx, -1], fed[idx, -1], pos[idx, -1] = batch.pending[idx], 1, batch.pos[idx]
        if batch.cache is None:
            cache, old_mask, old_pos = _growing_cache(self.model.config), fed[:, :0], pos[:, -1]
        else:
            cache, old_mask, old_pos = batch.cache, batch.mask, batch.pos
            if joiners:
                for layer in cache.layers:
                    for name in ("keys", "values"):
                        t = getattr(layer, name)
                        setattr(layer, name, torch.cat([t, t.new_zeros((len(joiners), *t.shape[1:]))]))
                old_mask = torch.cat([old_mask, old_mask.new_zeros((len(joiners), old_mask.shape[1]))])
                old_pos = torch.cat([old_pos, old_pos.new_zeros(len(joiners))])
        mask = torch.cat([old_mask, fed.to(old_mask.dtype)], dim=1)
        t0, c0 = time.perf_counter(), time.thread_time()
        with self._lock, torch.inference_mode(), self._kernels():
            out = last_logits_pass(self.model, ids, mask, pos, cache)
            version = self.weights_version
        t_fwd = time.perf_counter()
        if batch.cache is None:
            _check_cache(out.past_key_values)
        batch.rows = batch.rows + joiners
        batch.cache, batch.mask = out.past_key_values, mask
        batch.pos = torch.where(fed[:, -1].bool(), pos[:, -1] + 1, old_pos)
        batch.pending = self._sample(batch.rows, out.logits[:, -1], version)
        self.stats["prompt_tokens"] += sum(len(f) for f, _ in feeds.values())
        self.stats["reused_tokens"] += sum(r.reuse for r in resumes.values())
        if rows:
            self.stats["steps"] += 1
            self.stats["fused"] += bool(feeds)
            self.stats["widths"][batch.active] += 1
        else:
            self.stats["prefills"] += 1
        kind = "fused" if rows and feeds else "decode" if rows else "prefill"
        for r in [*resumes.values(), *joiners]:
            r.admitted = t0
        if self.trace is not None:  # the pass ended at the sync ``_sample`` does to read the tokens
            shape = (len(batch.rows), len(resumes) + len(joiners), width, mask.shape[1])
            cpu = time.thread_time() - c0
            self.trace.append(("pass", t0, time.perf_counter(), kind, *shape, cpu, t_fwd - t0))

    def _compact(self, batch: _Batch) -> None:
        """Once more than half the cache is padding, right-align every row's tokens and drop the
        columns no row uses."""
        import torch

        if not batch.rows or batch.mask.numel() <= 2 * int(batch.mask.sum()):
            return
        order = torch.argsort(batch.mask, dim=1, stable=True)  # padding first, tokens in order last
        mask = torch.gather(batch.mask, 1, order)
        start = int(mask.any(dim=0).nonzero()[0, 0])
        order, batch.mask = order[:, start:], mask[:, start:]
        for layer in batch.cache.layers:
            for name in ("keys", "values"):
                t = getattr(layer, name)
                idx = order[:, None, :, None].expand(-1, t.shape[1], -1, t.shape[3])
                setattr(layer, name, torch.gather(t, 2, idx))
        self.stats["compactions"] += 1

    def _sample(self, rows: list[_Request], logits: Any, version: int) -> Any:
        """Sample one token per active row with the row's own settings and generator; record raw
        logprobs. Parked rows' entries are left unused."""
        import torch

        with torch.inference_mode():
            logits = logits.float()
            raw = torch.log_softmax(logits, dim=-1)
            tokens = raw.argmax(dim=-1)
            hot = [i for i, r in enumerate(rows) if r.parked is None and not r.sampling.greedy]
            if hot:
                idx = torch.tensor(hot, device=logits.device)
                probs = _filtered_probs(logits[idx], [rows[i].sampling for i in hot])
                race = torch.empty_like(probs)
                for j, i in enumerate(hot):
                    race[j].exponential_(generator=self._generator(rows[i]))
                tokens[idx] = (probs / race).argmax(dim=-1)
            lps = raw.gather(1, tokens[:, None]).squeeze(1)
            now = time.perf_counter()
            for r, t, lp in zip(rows, tokens.tolist(), lps.tolist(), strict=True):
                if r.parked is None:
                    if not r.tokens:
                        r.first_token = now
                    r.tokens.append(t)
                    r.logprobs.append(lp)
                    r.versions.append(version)
        return tokens

    def _generator(self, r: _Request) -> Any:
        """The request's own RNG, seeded on first use."""
        if r.generator is None:
            import torch

            r.generator = torch.Generator(device=self.device)
            r.generator.manual_seed(r.seed)
        return r.generator

    def _retire(self, batch: _Batch) -> None:
        """Deliver finished rows (parking those with a route, their KV kept for the route's next
        turn), drop rows whose caller gave up, trim padding no row needs."""
        keep = []
        park = self.reuse_prefix and self.park_s > 0
        for i, r in enumerate(batch.rows):
            if r.parked is not None:
                keep.append(i)
            elif r.finished:
                if self._deliver(r, park):
                    keep.append(i)
            elif not r.gave_up():
                keep.append(i)
        self._keep(batch, keep)
        self._iteration_done()

    def _deliver(self, r: _Request, park: bool) -> bool:
        """Answer a finished request (and trace it); park its row when it has a route (True: the
        row stays, its KV kept for the route's next turn)."""
        if self.trace is not None:
            t = time.perf_counter()
            self.trace.append(("req", r.route, r.submitted, r.admitted, t, len(r.prompt_ids), len(r.tokens)))
        result = self._result(r)
        parked = park and r.route is not None
        if parked:  # before the caller hears back: a reset_prefix_cache() it then calls must see this row
            r.parked, r.epoch, r.generator = time.perf_counter(), self._epoch, None
        r.done(result)
        return parked

    def _keep(self, batch: _Batch, keep: list[int]) -> None:
        """Keep only these rows, and trim the leading cache columns none of them uses."""
        if len(keep) == len(batch.rows):
            return
        if not keep:
            batch.__init__()  # type: ignore[misc]
            return
        import torch

        idx = torch.tensor(keep, device=self.device)
        batch.rows = [batch.rows[i] for i in keep]
        mask = batch.mask[idx]
        start = int(mask.any(dim=0).nonzero()[0, 0])
        for layer in batch.cache.layers:
            layer.keys = layer.keys[idx, :, start:]
            layer.values = layer.values[idx, :, start:]
        batch.mask, batch.pos, batch.pending = mask[:, start:], batch.pos[idx], batch.pending[idx]

    def _merge(self, batch: _Batch, part: _Batch) -> None:
        """Join ``part``'s rows to the running batch, left-padding the shorter cache."""
        import torch
        from torch.nn.functional import pad

        if not part.rows:
            return
        if not batch.rows:
            batch.rows, batch.cache, batch.mask = part.rows, part.cache, part.mask
            batch.pos, batch.pending = part.pos, part.pending
            return
        t_old, t_new = batch.mask.shape[1], part.mask.shape[1]
        width = max(t_old, t_new)
        for old, new in zip(batch.cache.layers, part.cache.layers, strict=True):
            for name in ("keys", "values"):
                a, b = getattr(old, name), getattr(new, name)
                a = pad(a, (0, 0, width - t_old, 0))
                b = pad(b, (0, 0, width - t_new, 0))
                setattr(old, name, torch.cat([a, b], dim=0))
        batch.mask = torch.cat([pad(batch.mask, (width - t_old, 0)), pad(part.mask, (width - t_new, 0))])
        batch.pos = torch.cat([batch.pos, part.pos])
        batch.pending = torch.cat([batch.pending, part.pending])
        batch.rows = batch.rows + part.rows

    def _result(self, r: _Request) -> Generation:
        reason = "stop" if r.tokens[-1] in r.stops else "length"
        return Generation(
            token_ids=r.tokens,
            logprobs=r.logprobs,
            finish_reason=reason,
            text=self.tokenizer.decode(r.tokens, skip_special_tokens=True),
            prompt_len=len(r.prompt_ids),
            meta={
                "weights_version": [r.versions[0], r.versions[-1]],
                "timing": {  # the rollout ledger's parts of the caller's wait (turngym.rollout.ledger)
                    "queued": max(r.admitted - r.submitted, 0.0),
                    "prefill": max(r.first_token - r.admitted, 0.0),
                    "decode": max(time.perf_counter() - r.first_token, 0.0),
                },
            },
        )


def last_logits_pass(model: Any, ids: Any, mask: Any, pos: Any, cache: Any) -> Any:
    """One forward pass over a KV cache that keeps only the last position's logits."""
    return model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=pos,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )


def _attention_kernels(device: Any, cudnn: bool) -> Callable[[], Any]:
    """A context for the passes: on CUDA, SDPA without cuDNN's kernel (unless ``cudnn``), whose
    per-shape plan building costs more host time than a small model's whole step."""
    import contextlib

    if device.type != "cuda" or cudnn:
        return contextlib.nullcontext
    return _WithoutCudnnAttention


class _WithoutCudnnAttention:
    """Turns torch's cuDNN SDPA flag off while any pass of any backend in the process runs, and
    restores the caller's setting when the last one ends. The flag is process-wide, not per thread,
    so a plain save-and-restore per pass would let two scheduler threads restore each other's
    "off" for good; the other SDPA kernels keep whatever the process set."""

    _lock = threading.Lock()
    _depth = 0
    _saved = True

    def __enter__(self) -> None:
        import torch

        cls = type(self)
        with cls._lock:
            if cls._depth == 0:
                cls._saved = torch.backends.cuda.cudnn_sdp_enabled()
                torch.backends.cuda.enable_cudnn_sdp(False)
            cls._depth += 1

    def __exit__(self, *exc: object) -> None:
        import torch

        cls = type(self)
        with cls._lock:
            cls._depth -= 1
            if cls._depth == 0:
                torch.backends.cuda.enable_cudnn_sdp(cls._saved)


def _default_fuse_tokens(model: Any, device: Any) -> int:
    """Padding tokens a fused prefill+decode pass may add: on CUDA as many as cost about one extra
    pass's launch overhead in FLOPs (~10 ms at ~400 TFLOP/s: ~26k tokens for a 76M model, ~300 for a
    7B one); none on CPU, where a pass is compute-bound and padding is never free."""
    if device.type != "cuda":
        return 0
    params = sum(p.numel() for p in model.parameters())
    return int(4e12 / (2 * max(params, 1)))


def _filtered_probs(logits: Any, samplings: list[SamplingParams]) -> Any:
    """Row-wise temperature, then top-k, then top-p (nucleus), as probabilities."""
    import torch

    dev = logits.device
    temps = torch.tensor([s.temperature for s in samplings], device=dev, dtype=logits.dtype)
    scaled = logits / temps[:, None]
    if all(s.top_k <= 0 and s.top_p >= 1 for s in samplings):
        return torch.softmax(scaled, dim=-1)
    vocab = logits.shape[-1]
    top_k = torch.tensor([s.top_k if s.top_k > 0 else vocab for s in samplings], device=dev).clamp(max=vocab)
    top_p = torch.tensor([s.top_p for s in samplings], device=dev, dtype=logits.dtype)
    ordered, order = scaled.sort(dim=-1, descending=True)
    drop = torch.arange(vocab, device=dev)[None, :] >= top_k[:, None]
    ordered = ordered.masked_fill(drop, float("-inf"))
    probs = torch.softmax(ordered, dim=-1)
    drop = (probs.cumsum(dim=-1) - probs) > top_p[:, None]  # the top token always stays
    ordered = ordered.masked_fill(drop, float("-inf"))
    filtered = torch.full_like(scaled, float("-inf")).scatter(-1, order, ordered)
    return torch.softmax(filtered, dim=-1)


def _common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading ids two sequences share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _growing_cache(config: Any) -> Any:
    """A ``DynamicCache`` whose full-attention layers grow in place (see ``_growing_layer_class``)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=config)
    grow = _growing_layer_class()
    cache.layers = [grow() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


@functools.cache
def _growing_layer_class() -> type:
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        """A ``DynamicLayer`` whose keys and values are views of buffers with spare columns: a step
        writes its new columns in place, where ``DynamicLayer`` concatenates (a fresh allocation and
        a copy of the whole cache, per layer and step). When the scheduler replaces ``keys`` and
        ``values`` (rows joining or leaving, compaction), the next step moves them into new buffers
        with headroom (half the length again, at least 64 columns)."""

        _kbuf: Any = None
        _vbuf: Any = None

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            keys, n = self.keys, key_states.shape[-2]
            if keys.numel() == 0:
                keys = self.keys = key_states[..., :0, :]
                self.values = value_states[..., :0, :]
            t = keys.shape[-2]
            buf = self._kbuf
            if not (
                buf is not None
                and keys.data_ptr() == buf.data_ptr()
                and keys.shape[:2] == buf.shape[:2]
                and keys.stride() == buf.stride()
                and self.values.data_ptr() == self._vbuf.data_ptr()
                and t + n <= buf.shape[-2]
            ):
                cap = t + n + max(64, (t + n) // 2)
                shape = (*key_states.shape[:2], cap, key_states.shape[-1])
                self._kbuf, self._vbuf = keys.new_empty(shape), self.values.new_empty(shape)
                self._kbuf[..., :t, :] = keys
                self._vbuf[..., :t, :] = self.values
            self._kbuf[..., t : t + n, :] = key_states
            self._vbuf[..., t : t + n, :] = value_states
            self.keys, self.values = self._kbuf[..., : t + n, :], self._vbuf[..., : t + n, :]
            return self.keys, self.values

    return GrowingLayer


def _check_cache(cache: Any) -> None:
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    full = (DynamicLayer, _growing_layer_class())
    if not layers or any(type(layer) not in full for layer in layers):
        kinds = sorted({type(layer).__name__ for layer in layers or []}) or [type(cache).__name__]
        raise BackendError(
            f"continuous batching needs full-attention DynamicLayer caches; this model uses {kinds}"
        )


def _once(done: Callable[[Generation | BaseException], None]) -> Callable[[Generation | BaseException], None]:
    """``done`` called at most once: a request failed with its batch after it was answered keeps its answer."""
    called = False

    def reply(result: Generation | BaseException) -> None:
        nonlocal called
        if not called:
            called = True
            done(result)

    return reply


def _release_cuda_cache() -> None:
    """After an error (often CUDA out of memory) the dropped batch's cache blocks go back to the card."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _backend_error(e: BaseException) -> BackendError:
    return e if isinstance(e, BackendError) else BackendError(f"{type(e).__name__}: {e}")


def settle(fut: asyncio.Future, result: Generation | BaseException) -> None:
    """Resolve a caller's future with a generation or an error, unless it is already done."""
    if fut.done():
        return
    if isinstance(result, BaseException):
        fut.set_exception(result)
    else:
        fut.set_result(result)
