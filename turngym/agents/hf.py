"""``HFBackend``: transformers in-process (CPU or GPU) with continuous batching of concurrent requests.

    backend = HFBackend("tiny", max_batch_size=64)
    gen = await backend.generate(prompt_ids, SamplingParams(max_tokens=64, temperature=0, seed=7))

A scheduler thread owns the model. Requests join and leave the running batch between decode steps:
each iteration admits the requests that arrived, runs one decode step for every live row and retires
the rows that hit their own stop token or ``max_tokens`` (or whose caller gave up). The running batch
is one padded ``DynamicCache`` with a 2-D attention mask. Joiners are prefilled in the same forward
pass as the decode step (their prompts right-aligned with the running rows' next tokens) when the
padding that adds fits ``fuse_tokens`` (default on CUDA: what costs about one pass's kernel launches
in FLOPs, ~26k tokens for a 76M model, ~300 for 7B; 0 on CPU, where a pass costs its FLOPs); otherwise they get a left-padded prefill pass of
their own and their cache is merged in. Padding is trimmed as rows leave, and the cache is compacted
(every row's tokens right-aligned) once more than half of it is padding. A long generation therefore never holds a short one back, and a new
request waits at most one decode step, not a whole batch. (transformers' own
``ContinuousBatchingManager`` is not used: it samples every request from one global RNG with the
batch's shared settings and reports logprobs after temperature/top-k/top-p, while RL needs
per-request seeds and settings and the raw model logprobs.)

* Sampling settings are per request and mixed freely in one batch (greedy rows take the argmax).
* Per-request seeds: every request samples from its own ``torch.Generator`` (seeded by
  ``SamplingParams.seed``, else from torch's global RNG), one exponential race per token, so the
  same seed gives the same sample whatever else is in the batch (tested).
* Logprobs are the raw model log-probabilities of the sampled tokens (temperature 1, before top-k/p).
  Under greedy decoding a request batched with others gives the ids of the same request alone.
* ``update_weights(state_dict)`` takes the model lock, so it lands between two decode steps; rows in
  flight continue on the new weights. ``Generation.meta["weights_version"]`` is ``[first, last]``:
  the weight versions of a generation's first and last token (equal unless an update landed mid-way).

``generate_batch`` is the synchronous API (it runs the same scheduler in the calling thread).
``stats`` counts forward passes (prefill-only, decode, fused), cache compactions, the histogram of
batch widths and the seconds the scheduler thread sat idle with nothing to run (``idle_s``).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from turngym.agents.backend import BackendError, Generation, SamplingParams

_STOP = object()  # tells the scheduler thread to exit


@dataclass(eq=False)
class _Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    done: Callable[[Generation | BaseException], None]
    gave_up: Callable[[], bool] = lambda: False
    generator: Any = None
    stops: frozenset[int] = frozenset()
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return len(self.tokens) >= self.sampling.max_tokens or (
            bool(self.tokens) and self.tokens[-1] in self.stops
        )


@dataclass
class _Batch:
    """Live rows: a left-padded KV cache, its attention mask, each row's next position and next input."""

    rows: list[_Request] = field(default_factory=list)
    cache: Any = None
    mask: Any = None  # [B, T] long, 0 on left padding
    pos: Any = None  # [B] position id of the pending token
    pending: Any = None  # [B] last sampled token, not yet in the cache


class HFBackend:
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
        self.weights_version = 0
        self.stats: dict[str, Any] = {
            "prefills": 0,  # prefill-only passes
            "fused": 0,  # decode passes that also prefilled joiners
            "steps": 0,  # decode passes
            "compactions": 0,
            "widths": Counter(),  # decode passes by batch width
            "idle_s": 0.0,  # seconds the scheduler thread waited with nothing to run
        }
        self._lock = threading.Lock()
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()

    # ------------------------------------------------------------- async API
    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        *,
        route: str | None = None,
        adapter: str | None = None,
    ) -> Generation:
        if adapter is not None:
            raise BackendError(
                "HFBackend serves one set of weights; use update_weights() instead of adapters"
            )
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Generation] = loop.create_future()

        def done(result: Generation | BaseException) -> None:
            loop.call_soon_threadsafe(_settle, fut, result)

        req = self._request(prompt_ids, sampling, done, fut.done)
        self._ensure_thread()
        self._inbox.put(req)
        return await fut

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
        batch = _Batch()
        while waiting or batch.rows:
            room = self.max_batch_size - len(batch.rows)
            joiners, waiting = waiting[:room], waiting[room:]
            self._iterate(batch, joiners)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return results  # type: ignore[return-value]

    def update_weights(self, state_dict: dict[str, Any], strict: bool = True) -> None:
        """Load new weights into the live model, between two decode steps."""
        with self._lock:
            self.model.load_state_dict(state_dict, strict=strict)
            self.weights_version += 1

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
        bad = [t for t in prompt_ids if not 0 <= int(t) < self.vocab_size]
        if bad:
            raise BackendError(f"prompt token ids outside the vocabulary (size {self.vocab_size}): {bad[:5]}")
        seed = sampling.seed if sampling.seed is not None else int(torch.randint(0, 2**62, ()).item())
        gen = torch.Generator(device=self.device)
        gen.manual_seed(seed)
        stops = frozenset(sampling.stop_token_ids) or frozenset({self.tokenizer.eos_token_id})
        return _Request([int(t) for t in prompt_ids], sampling, done, gave_up, gen, stops)

    def _ensure_thread(self) -> None:
        with self._thread_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="hf-backend", daemon=True)
                self._thread.start()

    def _serve(self) -> None:
        """The scheduler thread: admit arrivals between decode steps until told to stop."""
        batch = _Batch()
        while (joiners := self._arrivals(batch)) is not None:
            self._iterate(batch, joiners)
        err = BackendError("the HF backend was closed")
        for r in batch.rows:
            r.done(err)
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                item.done(err)

    def _arrivals(self, batch: _Batch) -> list[_Request] | None:
        """Requests to admit now (None: stop). Idle, block for one, then gather more for ``max_wait``."""
        joiners: list[_Request] = []
        deadline = None
        if not batch.rows:
            t0 = time.perf_counter()
            item = self._inbox.get()
            self.stats["idle_s"] += time.perf_counter() - t0
            if item is _STOP:
                return None
            joiners.append(item)
            deadline = time.monotonic() + self.max_wait_s
        while len(batch.rows) + len(joiners) < self.max_batch_size:
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
        """One scheduler iteration: admit the joiners, one decode step for all, retire the finished.

        Joiners are prefilled in the same forward pass as the running rows' decode step when the
        padding that costs (running rows x longest prompt) fits ``fuse_tokens``; otherwise they get
        a prefill pass of their own first."""
        joiners = [r for r in joiners if not r.gave_up()]
        fuse = bool(joiners and batch.rows)
        if fuse:
            width = max(len(r.prompt_ids) for r in joiners)
            fuse = len(batch.rows) * (width - 1) <= self.fuse_tokens
        if joiners and not fuse:
            self._admit(batch, joiners)
        if batch.rows:
            try:
                self._decode(batch, joiners if fuse else [])
            except Exception as e:  # noqa: BLE001 - every live row gets the error, the thread survives
                err = _backend_error(e)
                for r in [*batch.rows, *(joiners if fuse else [])]:
                    r.done(err)
                batch.__init__()  # type: ignore[misc]
                return
            self._retire(batch)
            self._compact(batch)

    def _admit(self, batch: _Batch, joiners: list[_Request]) -> None:
        """Prefill the joiners; a failing group is retried one by one so only the culprit fails."""
        try:
            part = self._prefill(joiners)
        except Exception as e:  # noqa: BLE001
            if len(joiners) > 1:
                for r in joiners:
                    self._admit(batch, [r])
                return
            joiners[0].done(_backend_error(e))
            return
        self._retire(part)
        self._merge(batch, part)

    def _prefill(self, reqs: list[_Request]) -> _Batch:
        import torch
        from transformers import DynamicCache

        width = max(len(r.prompt_ids) for r in reqs)
        ids = torch.full((len(reqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(reqs), width), dtype=torch.long)
        for i, r in enumerate(reqs):
            ids[i, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids, dtype=torch.long)
            mask[i, width - len(r.prompt_ids) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        with self._lock, torch.inference_mode():
            out = self.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=pos,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            version = self.weights_version
        _check_cache(out.past_key_values)
        part = _Batch(reqs, out.past_key_values, mask, pos[:, -1] + 1)
        part.pending = self._sample(part.rows, out.logits[:, -1], version)
        self.stats["prefills"] += 1
        return part

    def _decode(self, batch: _Batch, joiners: list[_Request]) -> None:
        """One forward pass: each running row feeds its pending token; each joiner (if any) its
        prompt, right-aligned with the running rows' tokens. A joiner's rows of the cache start as
        masked zeros, and running rows get masked columns where the joiners' prompts sit (removed by
        ``_compact``)."""
        import torch

        dev, rows, width = self.device, len(batch.rows), max([1, *(len(r.prompt_ids) for r in joiners)])
        n = rows + len(joiners)
        ids = torch.full((n, width), self.pad_id, dtype=torch.long, device=dev)
        new_mask = torch.zeros((n, width), dtype=batch.mask.dtype, device=dev)
        pos = torch.zeros((n, width), dtype=torch.long, device=dev)
        ids[:rows, -1], new_mask[:rows, -1], pos[:rows, -1] = batch.pending, 1, batch.pos
        for j, r in enumerate(joiners, start=rows):
            k = len(r.prompt_ids)
            ids[j, width - k :] = torch.tensor(r.prompt_ids, dtype=torch.long, device=dev)
            new_mask[j, width - k :] = 1
            pos[j, width - k :] = torch.arange(k, device=dev)
        old_mask = batch.mask
        if joiners:
            for layer in batch.cache.layers:
                for name in ("keys", "values"):
                    t = getattr(layer, name)
                    setattr(layer, name, torch.cat([t, t.new_zeros((len(joiners), *t.shape[1:]))]))
            old_mask = torch.cat([old_mask, old_mask.new_zeros((len(joiners), old_mask.shape[1]))])
        mask = torch.cat([old_mask, new_mask], dim=1)
        with self._lock, torch.inference_mode():
            out = self.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=pos,
                past_key_values=batch.cache,
                use_cache=True,
                logits_to_keep=1,
            )
            version = self.weights_version
        batch.rows = batch.rows + joiners
        batch.cache, batch.mask = out.past_key_values, mask
        batch.pos = torch.cat([batch.pos + 1, pos[rows:, -1] + 1])
        batch.pending = self._sample(batch.rows, out.logits[:, -1], version)
        self.stats["steps"] += 1
        self.stats["fused"] += bool(joiners)
        self.stats["widths"][len(batch.rows)] += 1

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
        """Sample one token per row with the row's own settings and generator; record raw logprobs."""
        import torch

        with torch.inference_mode():
            logits = logits.float()
            raw = torch.log_softmax(logits, dim=-1)
            tokens = raw.argmax(dim=-1)
            hot = [i for i, r in enumerate(rows) if not r.sampling.greedy]
            if hot:
                idx = torch.tensor(hot, device=logits.device)
                probs = _filtered_probs(logits[idx], [rows[i].sampling for i in hot])
                race = torch.empty_like(probs)
                for j, i in enumerate(hot):
                    race[j].exponential_(generator=rows[i].generator)
                tokens[idx] = (probs / race).argmax(dim=-1)
            lps = raw.gather(1, tokens[:, None]).squeeze(1)
            for r, t, lp in zip(rows, tokens.tolist(), lps.tolist(), strict=True):
                r.tokens.append(t)
                r.logprobs.append(lp)
                r.versions.append(version)
        return tokens

    def _retire(self, batch: _Batch) -> None:
        """Deliver finished rows, drop rows whose caller gave up, trim padding no live row needs."""
        keep = []
        for i, r in enumerate(batch.rows):
            if r.finished:
                r.done(self._result(r))
            elif not r.gave_up():
                keep.append(i)
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
            meta={"weights_version": [r.versions[0], r.versions[-1]]},
        )


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


def _check_cache(cache: Any) -> None:
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        kinds = sorted({type(layer).__name__ for layer in layers or []}) or [type(cache).__name__]
        raise BackendError(
            f"continuous batching needs full-attention DynamicLayer caches; this model uses {kinds}"
        )


def _backend_error(e: BaseException) -> BackendError:
    return e if isinstance(e, BackendError) else BackendError(f"{type(e).__name__}: {e}")


def _settle(fut: asyncio.Future, result: Generation | BaseException) -> None:
    if fut.done():
        return
    if isinstance(result, BaseException):
        fut.set_exception(result)
    else:
        fut.set_result(result)
