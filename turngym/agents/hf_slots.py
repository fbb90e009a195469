"""``HFSlotBackend``: the HF backend on a static KV cache of fixed row slots, its decode steps
captured as CUDA graphs.

    backend = HFSlotBackend("smollm2-135m", device="cuda", max_batch_size=64, max_context=4096)

Why: ``HFBackend`` runs every decode step eagerly from Python, and for a small model the GPU idles
between kernel launches (about 35 ms a step for SmolLM2-135M's 30 layers at batch 1). Here the KV
cache is one static buffer per layer, ``[slots, kv_heads, max_context + 1, head_dim]``; a request
owns a slot and its tokens sit left-aligned in it (column = position), so a decode step has the same
shapes whenever the same slots and context bucket are in use. The whole step (embedding, every
layer, the last norm, the LM head) is captured once per (width, context) bucket as a CUDA graph and
replayed.

* **Widths and buckets.** A decode step runs slots ``0..w-1``, ``w`` the smallest power of two (or
  ``max_batch_size``) past the highest live slot; a new request takes the lowest free slot.
  Attention reads the first ``k`` columns, ``k`` the smallest bucket (64 * 2^i, or ``max_context``)
  past every live row's position, each row masked to ``column <= its position``. A parked or empty
  slot inside the window computes a throw-away token: its write lands at or past the end of its
  cached ids, which the row's own later feed overwrites before anything reads it.
* **Decode blocks**: one replay runs ``decode_block`` steps (default 8; single steps once no live row
  has that many tokens left), each writing the next column and sampling with the draw of the next
  token index, so the host waits for the device once a block; a row that finishes inside a block
  keeps only its tokens up to its end (``stats["block_steps_unused"]`` counts the steps past the
  last row's end). Joiners wait for the block in flight.
* **Prefill without a round trip** (``overlap_prefill``, default on): a prefill pass's inputs go
  up from pinned memory without waiting for the device, its first tokens are sampled into the
  decode inputs on the device, and the next decode block is queued behind it at once, joiners
  included; the host reads the first tokens with the block's (one wait for both). A joiner whose
  first token ends it (a stop token) rides that block and keeps none of its tokens. In the trace a
  prefill pass then ends when it is queued; its device time falls in the next decode block (and in
  the ledger's ``decode``: a row's first token is stamped when its pass was queued).
* **The forward** is ``turngym.agents.hf_fast`` for Llama, Mistral and Qwen2 models (18 kernels a
  layer instead of transformers' ~50; ``fast=False``, or a model it cannot run, gets transformers'
  forward; ``fast_problem`` says why).
* **Prefill**: joiners (fresh, or resuming their route's parked row) are fed together, up to
  ``prefill_tokens`` (rows x longest feed) a pass, their tokens right-aligned in the window;
  padded queries write to the scratch column past ``max_context``, which no one reads. A pass whose
  bucket comes back is replayed from a graph (``turngym.agents.hf_slot_prefill``).
* **Attention** (registered with transformers as ``"turngym_slots"``, switched on only during this
  backend's passes): a decode step does grouped-query attention with two matmuls straight on the
  cache buffers, with no ``repeat_kv`` copy of the whole cache per layer and step; prefill uses SDPA.
* **Sampling inside the graph, one host round trip a block**: per-request temperature/top-k/top-p
  and seed (slot buffers set at admission), greedy rows take the argmax, sampled rows take the
  inverse CDF at a uniform draw that is a hash of (request seed, token index), computed on the
  device (``seeded_uniforms``, bit for bit the host's ``seeded_uniform``), so a seed gives the same
  sample whatever else is in the batch, with no per-request RNG state. The host sends one small
  tensor a block (positions, token indices) and reads one back (tokens, raw model logprobs).
* The rest is ``HFBackend``'s: continuous batching (requests join and leave between decode steps),
  per-request settings, prefix reuse across a trajectory's turns (a parked row keeps its slot and KV),
  cancellation, ``update_weights`` (in place, between steps: the graphs read the same parameter
  storage, so they see the new weights), the trace, the stats and the ledger's queued/prefill/decode
  times. It runs in a worker process too (``HFProcessBackend(..., engine="slots")``).
* **Forks** (``share_prefix(route, child)``, a tree rollout's branch): the child's first request
  starts from an on-device copy of ``route``'s row (parked, running, or prefilled in the same
  iteration) up to their common prefix and prefills only the rest (``turngym.agents.hf_slot_share``;
  ``stats["shared_rows"]``, the copied columns count in ``reused_tokens``); no usable donor row, a full
  prefill.
* **Limits**: a prompt longer than ``max_context`` fails with ``BackendError``; a generation that
  reaches ``max_context`` ends with ``finish_reason="length"``. Full-attention decoders only (Llama,
  Qwen2, SmolLM2, ...): sliding-window, soft-capped or recurrent attention raises at construction.
  The slots take ``max_batch_size x (max_context + 1)`` tokens of KV up front (SmolLM2-135M in bf16:
  23 KB a token, 1.5 GB for 16 x 4096; ``kv_bytes``); more than half the device's free memory raises
  ``KVSlotsTooLarge`` (``make_hf_backend`` with engine ``auto`` then uses the continuous engine).
* **Fallback**: on CPU, or with ``cuda_graphs=False``, decode steps run the same code eagerly. A
  capture that fails (out of memory, an op that cannot be captured) turns graphs off for this backend
  with a warning, ``stats["graph_fallbacks"]`` counts it, and steps run eagerly.
* **Fused steps (``compile``)**: a captured step is some 600 small kernels (per layer: norms, rotary,
  residual adds, the MLP's activation; then the sampling), and replaying them is what a step costs.
  ``compile="default"`` (or ``True``) runs the decode step's model pass through ``torch.compile``
  (inductor fuses the elementwise, norm and rotary kernels; the sampling after it stays eager: inductor
  2.11 cannot lower its argmax over the vocabulary) before a bucket's graph captures the step, so the
  graph replays fewer, fused kernels; on CPU the compiled pass runs without graphs. The named
  settings are ``turngym.agents.hf_engines.COMPILE_SETTINGS``: ``default``;
  ``max-autotune-no-cudagraphs`` (Triton matmul templates autotuned per bucket); ``dynamic`` (one
  compile for every bucket, sizes symbolic). None uses inductor's own CUDA graphs (this backend
  captures them). The static settings compile once per (width, context) bucket, at its
  first step (seconds each, ``stats["compile_s"]``); dynamo keeps the code per process, so a later
  backend of the same shapes (the trainer makes one per rollout) reuses it. The compiled code reads
  the live parameters, so ``update_weights`` needs no recompile. A compile that fails (no C++
  compiler, an op inductor cannot lower, a crash) turns compiling off for this backend with a
  warning, ``stats["compile_fallbacks"]`` counts it, and steps run the plain body. Off by default;
  the trainer's ``rollout.backend.hf_compile``, ``AgentSpec.hf_compile``, the CLI's ``--hf-compile``.
  Experimental: on an idle H200 (SmolLM2, benchmarks/gpu_results.md session 11) the compiled step
  was captured and replayed (no fallback, no eager decode) yet ran at 0.75-0.89x the plain graphs'
  tokens/s at batch 1-64, and its greedy ids differed from eager's.

``stats`` adds ``graph_captures``, ``graph_replays``, ``eager_decodes``, ``graph_fallbacks``,
``capture_s``, ``compiles``, ``compile_s``, ``compile_fallbacks``, ``decode_blocks``,
``block_steps_unused`` and the prefill graphs' counters to ``HFBackend``'s.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from turngym.agents import hf_fast, hf_triton
from turngym.agents.backend import BackendError, SamplingParams
from turngym.agents.hf import (
    HFBackend,
    _backend_error,
    _common_prefix,
    _release_cuda_cache,
    _Request,
    last_logits_pass,
)
from turngym.agents.hf_engines import COMPILE_SETTINGS, compile_setting
from turngym.agents.hf_slot_prefill import PrefillGraphs, bucket
from turngym.agents.hf_slot_share import SlotSharing

log = logging.getLogger(__name__)

ATTENTION = "turngym_slots"  # the attention function's name in transformers' registry
KV_SHARE = 0.5  # the KV slots may take at most this share of the device's free memory
PREFILL_INTS = 6  # a prefill row's integer inputs after its ids and columns (``_prefill_inputs``)


class KVSlotsTooLarge(ValueError):
    """The KV slots would not fit the device (``make_hf_backend`` with ``auto`` falls back)."""


MIN_COLUMNS = 64  # the smallest context bucket


@dataclass
class _SlotBatch:
    """The scheduler's view of the slots: each slot's request (None: free) and how many cache
    columns it has written (= the position of its next token)."""

    slots: list[_Request | None]
    lengths: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.lengths = [0] * len(self.slots)

    @property
    def rows(self) -> list[_Request]:
        return [r for r in self.slots if r is not None]

    @property
    def active(self) -> int:
        return sum(r is not None and r.parked is None for r in self.slots)

    def live(self) -> list[int]:
        """Slots whose request is generating (not parked)."""
        return [s for s, r in enumerate(self.slots) if r is not None and r.parked is None]

    def free(self, s: int) -> None:
        self.slots[s], self.lengths[s] = None, 0


class _SlotCache:
    """What transformers' attention layers see as ``past_key_values``: ``update`` writes a pass's
    new keys and values where the pass's plan says (``index``: flat row of each new key) and returns
    the columns the pass attends to: slots ``0..width-1`` as a view, or the slots in ``rows``."""

    def __init__(self, keys: list[Any], values: list[Any]):
        self.keys, self.values = keys, values
        self.index: Any = None
        self.rows: Any = None
        self.width = 0
        self.columns = 0

    def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any):
        k, v = self.keys[layer_idx], self.values[layer_idx]
        d = k.shape[-1]
        flat = self.index.reshape(-1)
        k.view(-1, d).index_copy_(0, flat, key_states.reshape(-1, d))
        v.view(-1, d).index_copy_(0, flat, value_states.reshape(-1, d))
        if self.rows is None:
            return k[: self.width, :, : self.columns], v[: self.width, :, : self.columns]
        return k[self.rows, :, : self.columns], v[self.rows, :, : self.columns]


class HFSlotBackend(SlotSharing, PrefillGraphs, HFBackend):
    """``HFBackend`` on fixed KV slots with CUDA-graph decode steps (see the module doc).

    ``max_context``: cache columns per slot (default: the model's limit, at most 4096);
    ``cuda_graphs``: capture decode steps (default: on CUDA); ``compile``: fuse the decode step with
    ``torch.compile`` (a name in ``COMPILE_SETTINGS``, ``True`` for ``default``; default off);
    ``prefill_tokens``: rows x longest feed per prefill pass; ``overlap_prefill``: queue the decode
    block behind a prefill pass without reading its first tokens first (module doc); ``fast``: turngym's own forward
    (``hf_fast``; None: where the model allows it); ``kernels``: that forward's attention, rotary
    and SwiGLU as Triton kernels (``"triton"``, ``hf_triton``) or torch ops (``"torch"``); None:
    Triton on CUDA where it is installed. Other arguments as ``HFBackend`` (``fuse_tokens`` and
    ``cudnn_attention`` do not apply)."""

    sized_context = True  # ``make_hf_backend`` passes ``max_context`` on
    compiles = True  # ... and ``compile``

    def __init__(
        self,
        model: str | Path | Any,
        tokenizer: Any = None,
        *,
        max_context: int | None = None,
        cuda_graphs: bool | None = None,
        compile: bool | str | None = None,
        prefill_tokens: int = 16384,
        fast: bool | None = None,
        decode_block: int = 8,
        prefill_graph_tokens: int = 16384,
        kernels: str | None = None,
        overlap_prefill: bool = True,
        **kwargs: Any,
    ):
        setting = compile_setting(compile)  # a bad name fails before the model loads
        if kernels is not None and kernels not in hf_fast.KERNELS:
            raise ValueError(f"kernels must be one of {', '.join(hf_fast.KERNELS)} or None, got {kernels!r}")
        super().__init__(model, tokenizer, **kwargs)
        config = self.model.config
        problem = _attention_problem(config)
        if problem:
            raise self._refusal(
                ValueError(f"HFSlotBackend needs a full-attention decoder: {problem}; use HFBackend")
            )
        limit = getattr(config, "max_position_embeddings", None) or 4096
        max_context = int(max_context or min(limit, 4096))
        if not 1 <= max_context <= limit:
            raise ValueError(f"max_context must be in [1, {limit}] (the model's limit), got {max_context}")
        if prefill_tokens < 1:
            raise ValueError(f"prefill_tokens must be >= 1, got {prefill_tokens}")
        if decode_block < 1 or decode_block & (decode_block - 1):
            raise ValueError(f"decode_block must be a power of two >= 1, got {decode_block}")
        self.decode_block = decode_block
        self.overlap_prefill = bool(overlap_prefill)
        # prefill passes whose first tokens are still on the device: (rows, [2, rows] tokens and
        # logprobs, weights version, when queued)
        self._first: list[tuple[list[_Request], Any, int, float]] = []
        on_cuda = self.device.type == "cuda"
        if cuda_graphs and not on_cuda:
            raise ValueError("cuda_graphs needs the model on a CUDA device")
        self.max_context = max_context
        self.cuda_graphs = on_cuda if cuda_graphs is None else bool(cuda_graphs)
        self.prefill_tokens = prefill_tokens
        self.compile = setting
        self._compiled: Any = None  # the compiled model pass of a decode step, made on first use
        self.kv_bytes = kv_cache_bytes(self.model, self.max_batch_size, max_context + 1)
        free = free_device_bytes(self.device)
        if free is not None and self.kv_bytes > KV_SHARE * free:
            raise self._refusal(
                KVSlotsTooLarge(
                    f"the KV slots ({self.max_batch_size} x {max_context} tokens) take "
                    f"{self.kv_bytes / 2**30:.1f} GiB, over {KV_SHARE:.0%} of the device's free "
                    f"{free / 2**30:.1f} GiB: lower max_batch_size or max_context, or use the continuous engine"
                )
            )
        # the pass: turngym's own few-kernel forward where the model allows it (``hf_fast``)
        self.fast_problem = hf_fast.problem(self.model) if fast is not False else "fast=False"
        if fast and self.fast_problem:
            raise self._refusal(
                ValueError(f"fast=True, but the fast forward cannot run this model: {self.fast_problem}")
            )
        self._fast = (
            None if self.fast_problem else hf_fast.FastForward(self.model, max_context + 1, kernels=kernels)
        )
        self._cache: _SlotCache | None = None  # allocated on the first pass
        self._after: dict[int, _Request] = {}  # fork slot -> donor placed in the same iteration (_place)
        self._graphs: dict[tuple[int, int, bool, int], Any] = {}  # (width, context, filtered, steps)
        self._pool: Any = None
        self.stats.update(
            graph_captures=0,
            graph_replays=0,
            eager_decodes=0,
            graph_fallbacks=0,
            capture_s=0.0,
            compiles=0,
            compile_s=0.0,
            compile_fallbacks=0,
            decode_blocks=0,
            block_steps_unused=0,
        )
        self._init_prefill_graphs(prefill_graph_tokens)
        self._compiled_buckets: set[tuple[int, int]] = set()  # (width, context): no sampling inside
        # dynamo keeps one entry per bucket a static setting compiles: room for every bucket
        widths = len({bucket(n, 1, self.max_batch_size) for n in range(1, self.max_batch_size + 1)})
        contexts = len({bucket(n, MIN_COLUMNS, max_context) for n in range(1, max_context + 1)})
        self._recompile_limit = 2 * widths * contexts + 8
        _register_attention()

    def reset_prefix_cache(self) -> None:
        """Also rebuild the fast forward's concatenated weights at the next pass (for in-place
        changes that bypass the parameters' version counters, e.g. through ``.data``)."""
        super().reset_prefix_cache()
        if self._fast is not None:
            self._fast.invalidate()

    def _refusal(self, e: ValueError) -> ValueError:
        """``e`` carrying the loaded model and tokenizer, so a fallback need not load them again."""
        e.model, e.tokenizer = self.model, self.tokenizer  # type: ignore[attr-defined]
        return e

    # ------------------------------------------------------------- requests
    def _request(
        self, prompt_ids: list[int], sampling: SamplingParams, done: Any, gave_up: Any = lambda: False
    ):
        if len(prompt_ids) > self.max_context:
            raise BackendError(
                f"a prompt of {len(prompt_ids)} tokens does not fit the backend's context of {self.max_context}"
            )
        return super()._request(prompt_ids, sampling, done, gave_up)

    def _new_batch(self) -> _SlotBatch:
        self._first = []
        return _SlotBatch([None] * self.max_batch_size)

    # ------------------------------------------------------------- scheduler
    def _iterate(self, batch: _SlotBatch, joiners: list[_Request]) -> None:  # type: ignore[override]
        """Place the joiners in slots and prefill them, then one decode step for every live row;
        finished rows are delivered after each."""
        joiners = [r for r in joiners if not r.gave_up()]
        placed = self._place(batch, joiners)
        if placed:
            self._prefill(batch, placed)
            if not self.overlap_prefill or any(self._ends_at_first(batch, s, r) for s, r in placed):
                self._first_tokens()
                self._retire(batch)
        live = batch.live()
        if not live:
            if self._first:
                self._first_tokens()
                self._retire(batch)
            return
        try:
            self._decode(batch, live)
        except Exception as e:  # noqa: BLE001 - every live row gets the error, the thread survives
            self._first = []
            err = _backend_error(e)
            for s in live:
                batch.slots[s].done(err)  # type: ignore[union-attr]
                batch.free(s)
            return
        self._retire(batch)

    def _ends_at_first(self, batch: _SlotBatch, s: int, r: _Request) -> bool:
        """Whether a row just prefilled ends with its first token whatever it is (its ``max_tokens``
        or the end of the context): it is delivered before the decode block instead of riding it."""
        return r.sampling.max_tokens <= 1 or batch.lengths[s] >= self.max_context

    def _place(self, batch: _SlotBatch, joiners: list[_Request]) -> list[tuple[int, _Request]]:
        """A slot for each joiner: its route's parked row when the prompt extends what that row holds
        (it then feeds only the prompt after the reused prefix), else the lowest free slot, evicting
        the oldest parked row when none is free. Parked rows that expired, were released, hold KV of
        older weights or an older prefix-cache epoch, or lost their route's reuse, are freed. A fresh
        request of a forked route (``share_prefix``) starts from a copy of its donor's row, or waits
        for the prefill of a donor placed now (``turngym.agents.hf_slot_share``)."""
        now = time.perf_counter()
        released, self._released = self._released, set()
        parked: dict[str | None, int] = {}
        for s, r in enumerate(batch.slots):
            if r is None or r.parked is None:
                continue
            stale = r.epoch != self._epoch or r.versions[-1] != self.weights_version
            if stale or r.route in released or not self.reuse_prefix or now - r.parked > self.park_s:
                batch.free(s)
                self.stats["parked_dropped"] += 1
            else:
                parked[r.route] = s
        donors = self._donor_rows(batch)  # before any slot changes hands: the KV each holds now
        placed: list[tuple[int, _Request]] = []
        fresh: list[_Request] = []
        for r in joiners:
            s = parked.pop(r.route, None) if r.route is not None else None
            if s is not None:
                held = batch.slots[s].cached_ids  # type: ignore[union-attr]
                r.reuse = min(_common_prefix(held, r.prompt_ids), len(r.prompt_ids) - 1)
                if r.reuse > 0:
                    batch.slots[s] = r
                    placed.append((s, r))
                    continue
                batch.free(s)
                self.stats["parked_dropped"] += 1
            fresh.append(r)
        unclaimed = sorted((batch.slots[s].parked, s) for s in parked.values())  # type: ignore[union-attr]
        copies: list[tuple[int, int, int]] = []  # (donor slot, new slot, columns)
        joining: dict[int, str] = {}  # slot -> donor route, for forks whose donor has no row yet
        for r in fresh:
            s = next((i for i, x in enumerate(batch.slots) if x is None), None)
            if s is None:
                if not unclaimed:  # the arrivals never exceed the slots; a failsafe
                    r.done(BackendError("no free KV slot"))
                    continue
                _, s = unclaimed.pop(0)
                batch.free(s)
                self.stats["parked_dropped"] += 1
                self.stats["parked_evicted"] += 1
            r.reuse = self._share_row(donors, r, s, copies, joining)
            batch.slots[s] = r
            placed.append((s, r))
        if copies:
            self._copy_rows(copies)
        self._after = self._after_donors(placed, joining) if joining else {}
        return placed

    def _prefill(self, batch: _SlotBatch, placed: list[tuple[int, _Request]]) -> None:
        """Feed the placed rows; forks whose donor was placed now too (``_after``) after it, from a
        copy of its row."""
        after, self._after = self._after, {}
        self._prefill_rows(batch, [(s, r) for s, r in placed if s not in after])
        if after:
            self._first_tokens()  # a fork copies a donor whose prefill gave it a token
            self._share_joined(batch, after)
            self._prefill_rows(batch, [(s, r) for s, r in placed if s in after])

    def _prefill_rows(self, batch: _SlotBatch, placed: list[tuple[int, _Request]]) -> None:
        """Feed the rows in passes of at most ``prefill_tokens`` (rows x longest feed); a failing
        pass is retried row by row, so only the culprit fails."""
        group: list[tuple[int, _Request]] = []
        longest = 0
        for s, r in sorted(placed, key=lambda p: len(p[1].prompt_ids) - p[1].reuse):
            n = len(r.prompt_ids) - r.reuse
            if group and (len(group) + 1) * max(longest, n) > self.prefill_tokens:
                self._prefill_group(batch, group)
                group, longest = [], 0
            group.append((s, r))
            longest = max(longest, n)
        if group:
            self._prefill_group(batch, group)

    def _prefill_group(self, batch: _SlotBatch, group: list[tuple[int, _Request]]) -> None:
        try:
            self._prefill_pass(batch, group)
        except Exception as e:  # noqa: BLE001
            if len(group) > 1:
                for one in group:
                    self._prefill_group(batch, [one])
                return
            s, r = group[0]
            r.done(_backend_error(e))
            batch.free(s)

    def _prefill_pass(self, batch: _SlotBatch, group: list[tuple[int, _Request]]) -> None:
        """One pass, eager or replayed from its bucket's graph (``hf_slot_prefill``): every row's feed
        right-aligned in one window, written at its columns ``start..``; padded queries (and a
        graph's padding rows) write to the scratch column and attend to column 0 only. The host
        builds two small tensors (``_prefill_inputs``) and queues their copies and the pass
        (``_prefill_body``: the rows' sampling settings into their slots, the forward, the first
        tokens into the decode inputs); the tokens are read with the next decode block."""
        import torch

        self._buffers()
        feeds = [(s, r.prompt_ids[r.reuse :], r.reuse) for s, r in group]
        rows = [r for _, r in group]
        width = max(len(f) for _, f, _ in feeds)
        span = max(start + len(f) for _, f, start in feeds)
        filtered = any(_filtered(r) for r in rows)
        key = self._prefill_bucket(len(feeds), width, span, MIN_COLUMNS, filtered)  # None: eager, unpadded
        n_rows, n_cols = (key[0], key[1]) if key else (len(feeds), width)
        ints, floats = self._prefill_inputs(feeds, rows, n_rows, n_cols)
        t0, c0 = time.perf_counter(), time.thread_time()
        with self._lock, torch.inference_mode(), self._kernels(), _slot_attention(self.model):
            if self._fast is not None:
                self._fast.refresh()
            out = self._prefill_replay(key, ints, floats) if key else None
            if out is None:
                out = self._prefill_body(self._up(ints), self._up(floats), span, filtered)
            out = out[:, : len(feeds)].clone()  # a graph's output is overwritten by its next replay
            version = self.weights_version
        t_fwd = time.perf_counter()
        self._first.append((rows, out, version, t_fwd))
        for s, f, start in feeds:
            batch.lengths[s] = start + len(f)
            batch.slots[s].admitted = t0  # type: ignore[union-attr]
        self.stats["prefills"] += 1
        self.stats["prompt_tokens"] += sum(len(f) for _, f, _ in feeds)
        self.stats["reused_tokens"] += sum(r.reuse for r in rows)
        if self.trace is not None:
            shape = (batch.active, len(group), width, span)
            cpu = time.thread_time() - c0
            self.trace.append(("pass", t0, time.perf_counter(), "prefill", *shape, cpu, t_fwd - t0))

    def _prefill_inputs(
        self, feeds: list[tuple[int, list[int], int]], rows: list[_Request], n_rows: int, n_cols: int
    ) -> tuple[Any, Any]:
        """A pass's inputs as two host tensors built from plain lists (one tensor op each, however
        many rows): int64 ``[n_rows, 2 * n_cols + PREFILL_INTS]`` (ids, columns, then slot,
        settings slot, top-k, greedy, the seed's low and high 32 bits) and float32 ``[n_rows, 3]``
        (temperature, top-p, the first token's draw). Padding rows (``_prefill_padding``) feed the pad
        id at the scratch column of slot 0 and keep their settings and token in the spare slot."""
        import torch

        scratch = self.max_context
        ints: list[list[int]] = []
        floats: list[list[float]] = []
        for (s, f, start), r in zip(feeds, rows, strict=True):
            pad, sp = n_cols - len(f), r.sampling
            ids = [self.pad_id] * pad + list(f)
            cols = [scratch] * pad + list(range(start, start + len(f)))
            ints.append(ids + cols + [s, s, sp.top_k, int(sp.greedy), r.seed & _LOW, (r.seed >> 32) & _LOW])
            floats.append([1.0 if sp.greedy else sp.temperature, sp.top_p, seeded_uniform(r.seed, 0)])
        pad_ints, pad_floats = self._prefill_padding(n_cols)
        ints += [pad_ints] * (n_rows - len(feeds))
        floats += [pad_floats] * (n_rows - len(feeds))
        return torch.tensor(ints, dtype=torch.long), torch.tensor(floats, dtype=torch.float32)

    def _prefill_padding(self, n_cols: int) -> tuple[list[int], list[float]]:
        """A padding row's inputs: the pad id at slot 0's scratch column, greedy, its settings and
        token in the spare slot past the last."""
        ints = [self.pad_id] * n_cols + [self.max_context] * n_cols + [0, self.max_batch_size, 0, 1, 0, 0]
        return ints, [1.0, 1.0, 0.5]

    def _prefill_body(self, ints: Any, floats: Any, span: int, filtered: bool) -> Any:
        """A prefill pass on the device, from its inputs (``_prefill_inputs``, on the device) to
        ``[2, rows]`` first tokens and raw logprobs (float64): the rows' sampling settings and seeds
        into their slots' buffers, the forward over the first ``span`` columns, the first token of
        each row sampled and written to the next decode step's inputs; what a prefill graph
        captures."""
        import torch

        n_cols = (ints.shape[1] - PREFILL_INTS) // 2
        ids, cols = ints[:, :n_cols], ints[:, n_cols : 2 * n_cols]
        slots, home, top_k, greedy, lo, hi = ints[:, 2 * n_cols :].unbind(1)
        greedy = greedy.bool()
        temp, top_p, u = floats.unbind(1)
        self._temp[home], self._greedy[home], self._top_k[home], self._top_p[home] = (
            temp,
            greedy,
            top_k,
            top_p,
        )
        self._seeds[0, home], self._seeds[1, home] = lo, hi
        logits = self._prefill_logits(ids, cols, slots, span)
        tok, lp = self._pick(logits, temp, greedy, top_k, top_p, u, filtered)
        self._ids[home] = tok
        return torch.stack([tok.double(), lp.double()])

    def _prefill_logits(self, ids: Any, cols: Any, slots: Any, span: int) -> Any:
        """A prefill pass's logits (each row's last position): ``ids`` and ``cols`` ``[rows, feed]``
        on the device (a padded query's column is the scratch column), ``slots`` ``[rows]``, the
        first ``span`` columns attended; the forward of ``_prefill_body``."""
        import torch

        cache = self._cache
        assert cache is not None
        real = cols < self.max_context
        pos = torch.where(real, cols, 0)
        keys = self._columns[:span]
        mask = torch.where(real[:, :, None], keys <= cols[:, :, None], keys == 0)[:, None]
        cache.index = self._row_base[slots][:, :, None] + cols[:, None, :]
        cache.rows, cache.columns = slots, span
        return self._logits(ids, mask, pos, cache)

    def _decode(self, batch: _SlotBatch, live: list[int]) -> None:
        """One decode block for every live row: ``n`` steps (``decode_block``, or 1 when no live row
        has that many tokens left) over slots ``0..w-1`` and the first ``k`` columns
        (buckets), sampling included, replayed from one CUDA graph when graphs are on. The host sends
        one small tensor (each slot's position and token index) and reads one back (``n`` tokens and
        logprobs a slot); a row that finishes inside the block keeps only its tokens up to there."""
        import torch

        self._buffers()
        rows = [batch.slots[s] for s in live]
        # a full block while some row has that many tokens left, else single steps: two block sizes
        # a (width, context) bucket, so few graphs to capture
        unread = {r for queued, *_ in self._first for r in queued}  # first token still on the device
        had = [len(r.tokens) + (r in unread) for r in rows]  # type: ignore[union-attr]
        left = max(r.sampling.max_tokens - h for r, h in zip(rows, had, strict=True))  # type: ignore[union-attr]
        n = self.decode_block if left >= self.decode_block else 1
        w = bucket(max(live) + 1, 1, self.max_batch_size)
        k = bucket(max(batch.lengths[s] for s in live) + n, MIN_COLUMNS, self.max_context)
        filtered = any(_filtered(r) for r in rows)  # type: ignore[arg-type]
        index = [0] * w
        for s, h in zip(live, had, strict=True):
            index[s] = h
        self._step_in[:, :w].copy_(self._pinned(torch.tensor([batch.lengths[:w], index])), non_blocking=True)
        t0, c0 = time.perf_counter(), time.thread_time()
        with self._lock, torch.inference_mode(), self._kernels(), _slot_attention(self.model):
            if self._fast is not None:
                self._fast.refresh()  # the concatenated weights, if the model's changed
            graph = self._graph(w, k, filtered, n) if self.cuda_graphs else None
            if graph is not None:
                graph.replay()
                self.stats["graph_replays"] += 1
            else:
                self._step(w, k, filtered, n)
                self.stats["eager_decodes"] += 1
            version = self.weights_version
        t_fwd = time.perf_counter()
        out = self._step_out[:n, :, :w].tolist()  # the block's only wait for the device
        self._first_tokens()  # the prefill passes queued before the block are done too
        used = 0
        for s, r in zip(live, rows, strict=True):
            took = self._take(
                r,
                [out[j][0][s] for j in range(n)],
                [out[j][1][s] for j in range(n)],
                version,
                batch.lengths[s],
            )  # type: ignore[arg-type]
            batch.lengths[s] += took
            used = max(used, took)
        self.stats["steps"] += n
        self.stats["decode_blocks"] += 1
        self.stats["block_steps_unused"] += n - used
        self.stats["widths"][len(live)] += n
        if self.trace is not None:
            cpu = time.thread_time() - c0
            self.trace.append(
                ("pass", t0, time.perf_counter(), "decode", len(live), 0, w, k, cpu, t_fwd - t0, n)
            )

    def _take(
        self, r: _Request, tokens: list[float], logprobs: list[float], version: int, length: int
    ) -> int:
        """Append a block's tokens to ``r`` up to its end (a stop token, its ``max_tokens``, or the end
        of the context); how many it took (= the cache columns its steps wrote)."""
        if r.finished:  # its first token (read with this block) ended it
            return 0
        now = time.perf_counter()
        if not r.tokens:
            r.first_token = now
        took = 0
        for t, lp in zip(tokens, logprobs, strict=True):
            r.tokens.append(int(t))
            r.logprobs.append(lp)
            r.versions.append(version)
            took += 1
            if r.finished or length + took >= self.max_context:
                break
        return took

    def _decode_logits(self, w: int, k: int, pos: Any = None) -> Any:
        """The model's pass of a decode step over slots ``0..w-1`` and ``k`` columns, from the static
        inputs (``_ids``; positions ``pos``, default ``_step_in``'s) to the last position's fp32
        logits: the part ``compile`` fuses."""
        cache = self._cache
        assert cache is not None
        if pos is None:
            pos = self._step_in[0, :w]
        pos = pos[:, None]
        ids = self._ids[:w, None]
        cache.index = (self._row_base[:w] + pos)[:, :, None]
        cache.rows, cache.width, cache.columns = None, w, k
        mask = (self._columns[None, :k] <= pos)[:, None, None, :]
        return self._logits(ids, mask, pos, cache)

    def _logits(self, ids: Any, mask: Any, pos: Any, cache: _SlotCache) -> Any:
        """The pass's fp32 logits at each row's last position: the fast forward, or transformers'."""
        if self._fast is not None:
            return self._fast.logits(ids, pos, cache, mask)
        return last_logits_pass(self.model, ids, mask, pos, cache).logits[:, -1].float()

    def _decode_body(self, w: int, k: int, filtered: bool, n: int = 1, logits_fn: Any = None) -> None:
        """``n`` decode steps of slots ``0..w-1`` over ``k`` columns, from the static inputs
        (``_ids``; ``_step_in``: positions and token indices; the slots' seeds and sampling
        settings) to the static outputs (``_step_out[j]``: step ``j``'s tokens and raw logprobs;
        ``_ids``: the next block's inputs); what a graph captures. Step ``j`` writes column
        position + ``j`` (past ``max_context``: the scratch column) and samples with the draw of
        token index + ``j``. ``logits_fn``: the (compiled) model pass; sampling stays eager, since
        inductor cannot lower an argmax over a 49k vocabulary on every version (torch 2.11:
        "NYI TritonSplitDimKernel reductions") and the sampling is a few kernels."""
        import torch

        pos0, index0 = self._step_in[0, :w], self._step_in[1, :w]
        steps = torch.arange(n, device=pos0.device)[:, None]
        draws = seeded_uniforms(self._seeds[0, :w], self._seeds[1, :w], index0[None, :] + steps)
        for j in range(n):
            pos = (pos0 + j).clamp(max=self.max_context)
            logits = (logits_fn or self._decode_logits)(w, k, pos)
            tok, lp = self._pick(
                logits, self._temp[:w], self._greedy[:w], self._top_k[:w], self._top_p[:w], draws[j], filtered
            )
            self._ids[:w].copy_(tok)
            self._step_out[j, 0, :w].copy_(tok)
            self._step_out[j, 1, :w].copy_(lp)

    def _pick(
        self, logits: Any, temp: Any, greedy: Any, top_k: Any, top_p: Any, u: Any, filtered: bool
    ) -> tuple[Any, Any]:
        """``pick``, or with the fast forward's Triton kernels and no top-k/top-p row, its one-kernel
        sampler (``hf_triton.sample``: the softmax, cumulative sum and search of ``pick`` were a
        quarter of a 256-row decode step on an H200)."""
        fast = self._fast
        if not filtered and fast is not None and fast.kernels != "torch":
            return hf_triton.sample(logits, temp, greedy, u, interpret=fast.kernels == "interpret")
        return pick(logits, temp, greedy, top_k, top_p, u, filtered)

    def _body(self) -> Any:
        """The decode body to run: with the model pass compiled (``compile`` on; compiling on its
        first call for a bucket) or plain."""
        if self.compile is None:
            return self._decode_body
        if self._compiled is None:
            import torch

            self._compiled = torch.compile(self._decode_logits, **COMPILE_SETTINGS[self.compile])
        return functools.partial(self._decode_body, logits_fn=self._compiled)

    def _step(self, w: int, k: int, filtered: bool, n: int) -> None:
        """One decode body, outside a capture: compiled when ``compile`` is on (the bucket's first
        call compiles it, timed in ``stats``); a compile that fails turns compiling off for this
        backend, with a warning and ``stats["compile_fallbacks"]``, and runs the plain body."""
        if self.compile is None:
            self._decode_body(w, k, filtered, n)
            return
        import torch

        first = (w, k) not in self._compiled_buckets
        t0 = time.perf_counter()
        try:
            # static settings keep one dynamo entry per bucket: room for every bucket
            with torch._dynamo.config.patch(recompile_limit=self._recompile_limit):
                self._body()(w, k, filtered, n)
        except Exception as e:  # noqa: BLE001 - no compiler, an op inductor cannot lower, a crash
            self.compile, self._compiled = None, None
            self.stats["compile_fallbacks"] += 1
            why = str(e).strip().splitlines()
            log.warning(
                "torch.compile of the decode step failed (%s: %s); running it uncompiled from now on",
                type(e).__name__,
                why[0] if why else "",
            )
            self._decode_body(w, k, filtered, n)
            return
        if first:
            self._compiled_buckets.add((w, k))
            self.stats["compiles"] += 1
            self.stats["compile_s"] += time.perf_counter() - t0

    def _graph(self, w: int, k: int, filtered: bool, n: int) -> Any:
        """The captured decode block for (w, k, top-k/top-p filtering or not, n steps), captured on
        first use; None (and graphs off, with a warning) when a capture fails."""
        graph = self._graphs.get((w, k, filtered, n))
        if graph is not None:
            return graph
        import torch

        t0 = time.perf_counter()
        try:
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            # warm-up: one step of the block's own inputs (its kernels are every step's), so its KV
            # write is the block's own; it samples into _ids, which get the block's inputs back after
            pending = self._ids.clone()
            side = torch.cuda.Stream(device=self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                self._step(w, k, filtered, 1)  # compiles the bucket's body (compile on), or falls back
            torch.cuda.current_stream(self.device).wait_stream(side)
            self._ids.copy_(pending)
            body = self._body()  # compiled (the warm-up compiled this bucket) or plain
            graph = torch.cuda.CUDAGraph()
            with (
                torch._dynamo.config.patch(recompile_limit=self._recompile_limit),
                torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"),
            ):
                body(w, k, filtered, n)
        except Exception as e:  # noqa: BLE001 - out of memory or an op that cannot be captured
            self.cuda_graphs = False
            self._graphs.clear()
            self.stats["graph_fallbacks"] += 1
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            log.warning(
                "CUDA graph capture failed (%s: %s); decoding eagerly from now on", type(e).__name__, e
            )
            return None
        self._graphs[(w, k, filtered, n)] = graph
        self.stats["graph_captures"] += 1
        self.stats["capture_s"] += time.perf_counter() - t0
        return graph

    def precapture(self, context: int | None = None, filtered: tuple[bool, ...] = (False,)) -> int:
        """Capture now the decode graphs of every width bucket, every context bucket up to
        ``context`` (default ``max_context``) and both block sizes (and each ``filtered``: whether
        top-k/top-p rows take part), so that no capture (0.1-0.3 s each with 8-step blocks on an
        H100/H200) lands inside a latency-sensitive or measured run; how many it captured (0 without
        CUDA graphs). Safe while serving: it holds the model lock between passes, and its warm-ups
        write only the scratch column, restoring the step inputs after."""
        if not self.cuda_graphs:
            return 0
        import torch

        self._buffers()
        top = min(context or self.max_context, self.max_context)
        widths = sorted({bucket(n, 1, self.max_batch_size) for n in range(1, self.max_batch_size + 1)})
        contexts = sorted({bucket(n, MIN_COLUMNS, self.max_context) for n in range(1, top + 1)})
        before = self.stats["graph_captures"]
        with self._lock, torch.inference_mode(), self._kernels(), _slot_attention(self.model):
            if self._fast is not None:
                self._fast.refresh()
            saved_in, saved_ids = self._step_in.clone(), self._ids.clone()
            try:
                self._step_in[0].fill_(self.max_context)  # the warm-ups' KV writes: the scratch column
                for w in widths:
                    for k in contexts:
                        for f in filtered:
                            for n in sorted({1, self.decode_block}):
                                if self.cuda_graphs and (w, k, f, n) not in self._graphs:
                                    self._graph(w, k, f, n)
            finally:
                self._step_in.copy_(saved_in)
                self._ids.copy_(saved_ids)
        return self.stats["graph_captures"] - before

    def _pinned(self, host: Any) -> Any:
        """``host`` (a CPU tensor) in page-locked memory when the device is CUDA, so a copy to the
        device can be queued without waiting for the device (``non_blocking``)."""
        return host.pin_memory() if self.device.type == "cuda" else host

    def _up(self, host: Any) -> Any:
        """``host`` on the device, its copy queued behind the device's work, not waited for."""
        return self._pinned(host).to(self.device, non_blocking=True)

    def _first_tokens(self) -> None:
        """Append the first token and raw logprob of each row of the prefill passes read back now
        (one wait for the device: the passes were queued before)."""
        first, self._first = self._first, []
        for rows, out, version, at in first:
            host = out.tolist()
            for r, t, lp in zip(rows, host[0], host[1], strict=True):
                if not r.tokens:
                    r.first_token = at
                r.tokens.append(int(t))
                r.logprobs.append(lp)
                r.versions.append(version)

    def _retire(self, batch: _SlotBatch) -> None:  # type: ignore[override]
        """Deliver finished rows (done, out of tokens, or at the end of the context), parking those
        with a route in their slot; free the slots of rows whose caller gave up."""
        park = self.reuse_prefix and self.park_s > 0
        for s, r in enumerate(batch.slots):
            if r is None or r.parked is not None:
                continue
            if r.finished or batch.lengths[s] >= self.max_context:
                if not self._deliver(r, park):
                    batch.free(s)
            elif r.gave_up():
                batch.free(s)
        self._iteration_done()

    # ------------------------------------------------------------- buffers
    def free_buffers(self) -> None:
        """Give the KV slots and the captured graphs back to the device (the trainer calls this
        after each rollout, so its update has the room); the next pass makes them again. Only while
        the scheduler is stopped (after ``aclose``, which also ends every parked row)."""
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError("free_buffers() while the backend is serving: aclose() it first")
        self._cache, self._pool = None, None
        self._graphs.clear()
        self._prefill_graphs.clear()
        _release_cuda_cache()

    def _buffers(self) -> _SlotCache:
        """The slots' KV buffers and the graphs' static inputs and outputs, made on first use."""
        if self._cache is not None:
            return self._cache
        import torch

        config = self.model.config
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        dtype = next(self.model.parameters()).dtype
        slots, columns, dev = self.max_batch_size, self.max_context + 1, self.device
        shape = (slots, kv_heads, columns, head_dim)
        n = config.num_hidden_layers
        keys = [torch.zeros(shape, dtype=dtype, device=dev) for _ in range(n)]
        values = [torch.zeros(shape, dtype=dtype, device=dev) for _ in range(n)]
        # the flat row of (slot, head, column 0) in a layer's buffer viewed as [-1, head_dim]
        base = torch.arange(slots * kv_heads, device=dev).view(slots, kv_heads) * columns
        self._row_base = base
        self._columns = torch.arange(columns, device=dev)
        # a slot's next input, sampling settings and seed; one spare entry past the slots, where a
        # prefill graph's padding rows put theirs
        spare = slots + 1
        self._ids = torch.full((spare,), self.pad_id, dtype=torch.long, device=dev)
        self._step_in = torch.zeros((2, slots), dtype=torch.long, device=dev)  # positions, token indices
        self._seeds = torch.zeros((2, spare), dtype=torch.long, device=dev)  # each seed's low, high 32 bits
        # step j of a block: tokens, logprobs
        self._step_out = torch.zeros((self.decode_block, 2, slots), dtype=torch.float64, device=dev)
        self._temp = torch.ones(spare, device=dev)
        self._greedy = torch.ones(spare, dtype=torch.bool, device=dev)
        self._top_k = torch.zeros(spare, dtype=torch.long, device=dev)
        self._top_p = torch.ones(spare, device=dev)
        self._cache = _SlotCache(keys, values)
        return self._cache


def kv_cache_bytes(model: Any, slots: int, columns: int) -> int:
    """Bytes of the slots' keys and values for ``model`` (every layer, its dtype)."""
    config = model.config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    size = next(model.parameters()).element_size()
    return 2 * config.num_hidden_layers * slots * kv_heads * columns * head_dim * size


def free_device_bytes(device: Any) -> int | None:
    """Free memory of a CUDA device (None elsewhere: no budget to check)."""
    if getattr(device, "type", str(device)) != "cuda":
        return None
    import torch

    return int(torch.cuda.mem_get_info(device)[0])


def _attention_problem(config: Any) -> str | None:
    """Why a model's attention cannot run on the slots (None: it can)."""
    kinds = set(getattr(config, "layer_types", None) or [])
    if kinds - {"full_attention"}:
        return f"its layers include {sorted(kinds - {'full_attention'})}"
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        return "it uses sliding-window attention"
    if getattr(config, "attn_logit_softcapping", None):
        return "it soft-caps attention logits"
    if not hasattr(config, "num_hidden_layers") or not hasattr(config, "num_attention_heads"):
        return "its config has no num_hidden_layers/num_attention_heads"
    return None


@functools.cache
def _register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, slot_attention)


@contextlib.contextmanager
def _slot_attention(model: Any) -> Iterator[None]:
    """The model's attention is ``slot_attention`` for the pass (the caller holds the model lock)."""
    config = model.config
    saved = config._attn_implementation
    config._attn_implementation = ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = saved


def slot_attention(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Any, None]:
    """Attention over slot-cache columns with a boolean ``[rows, 1, queries, columns]`` mask.
    One query (a decode step): query heads grouped by their key/value head, two matmuls on the
    cache's own strides. Several (prefill): SDPA on repeated key/value heads."""
    import torch

    b, h, n, d = query.shape
    kv = key.shape[1]
    if scaling is None:
        scaling = d**-0.5
    if n > 1:
        from torch.nn.functional import scaled_dot_product_attention

        if h != kv:
            key, value = key.repeat_interleave(h // kv, dim=1), value.repeat_interleave(h // kv, dim=1)
        out = scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=scaling)
        return out.transpose(1, 2).contiguous(), None
    q = query.reshape(b, kv, h // kv, d)
    scores = torch.matmul(q, key.transpose(-1, -2)).float() * scaling
    scores = scores.masked_fill(~attention_mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    return torch.matmul(probs, value).reshape(b, 1, h, d), None


_M1, _M2, _LOW = 0x7FEB352D, 0x846CA68B, 0xFFFFFFFF


def _mix32(x: int) -> int:
    """A 32-bit integer hash (lowbias32)."""
    x ^= x >> 16
    x = (x * _M1) & _LOW
    x ^= x >> 15
    x = (x * _M2) & _LOW
    return x ^ (x >> 16)


def seeded_uniform(seed: int, index: int) -> float:
    """A uniform draw in (0, 1), a pure function of a request's seed and the index of the token it
    samples: the same seed gives the same draws whatever else is in the batch."""
    lo, hi = seed & _LOW, (seed >> 32) & _LOW
    x = _mix32(_mix32(lo ^ _mix32(hi ^ 0x9E3779B9)) ^ _mix32((index + 0x632BE5AB) & _LOW))
    return ((x >> 8) + 0.5) / (1 << 24)


def _mul32(x: Any, m: int) -> Any:
    """``(x * m) mod 2^32`` for int64 tensors ``x`` < 2^32 without overflowing int64: the product in
    two 16-bit halves of ``x``."""
    return (((x & 0xFFFF) * m) + ((((x >> 16) * m) & 0xFFFF) << 16)) & _LOW


def _mix32_t(x: Any) -> Any:
    """``_mix32`` on an int64 tensor of 32-bit values."""
    x = x ^ (x >> 16)
    x = _mul32(x, _M1)
    x = x ^ (x >> 15)
    x = _mul32(x, _M2)
    return x ^ (x >> 16)


def seeded_uniforms(lo: Any, hi: Any, index: Any) -> Any:
    """``seeded_uniform`` on tensors, on the device and inside a graph: ``lo``/``hi`` the seeds'
    low and high 32 bits, ``index`` the token indices (broadcast); float32 draws, bit for bit
    ``seeded_uniform``'s."""
    x = _mix32_t(_mix32_t(lo ^ _mix32_t(hi ^ 0x9E3779B9)) ^ _mix32_t((index + 0x632BE5AB) & _LOW))
    return (((x >> 8).double() + 0.5) / (1 << 24)).float()


def _filtered(r: _Request) -> bool:
    return r.sampling.top_k > 0 or r.sampling.top_p < 1


def pick(
    logits: Any, temp: Any, greedy: Any, top_k: Any, top_p: Any, u: Any, filtered: bool
) -> tuple[Any, Any]:
    """One token per row of ``logits`` ``[rows, vocab]`` (float) and its raw logprob: greedy rows
    the argmax; the others by inverse CDF at their uniform draw ``u`` over the tempered (and, when
    ``filtered``, top-k/top-p filtered) distribution. Per-row settings are tensors; no host sync, so
    a CUDA graph can hold it."""
    import torch

    best = logits.argmax(dim=-1)
    z = logits / temp[:, None]
    if filtered:
        vocab = z.shape[-1]
        k = torch.where(top_k > 0, top_k, vocab).clamp(max=vocab)
        ordered, order = z.sort(dim=-1, descending=True)
        ranks = torch.arange(vocab, device=z.device)
        ordered = ordered.masked_fill(ranks[None, :] >= k[:, None], float("-inf"))
        probs = torch.softmax(ordered, dim=-1)
        ordered = ordered.masked_fill((probs.cumsum(dim=-1) - probs) > top_p[:, None], float("-inf"))
        z = torch.full_like(z, float("-inf")).scatter(-1, order, ordered)  # the top token always stays
    cdf = torch.exp(z - z.max(dim=-1, keepdim=True).values).cumsum(dim=-1)
    drawn = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0].clamp(max=z.shape[-1] - 1)
    tok = torch.where(greedy, best, drawn)
    lp = logits.gather(1, tok[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)
    return tok, lp
