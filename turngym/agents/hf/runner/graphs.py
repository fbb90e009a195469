"""Decode blocks replayed as CUDA graphs, and their optional ``torch.compile``.

The whole decode block (embedding, every layer, the last norm, the LM head, the sampling) is
captured once per (width, context, filtered, steps) bucket and replayed; a step then costs what
replaying its kernels costs. ``precapture`` captures every bucket up front, so no capture lands
inside a measured or latency-sensitive run. A capture that fails (out of memory, an op that cannot
be captured) turns graphs off for the engine with a warning (``stats["graph_fallbacks"]``).

``compile`` (a name in ``turngym.agents.hf.registry.COMPILE_SETTINGS``) runs the decode step's model
pass through ``torch.compile`` before a bucket's graph captures it (the sampling stays eager); the
static settings compile once per bucket at its first step (``stats["compile_s"]``). A compile that
fails turns compiling off with a warning (``stats["compile_fallbacks"]``). Experimental; the
measurements are in docs/engines.md.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

from turngym.agents.hf.plan import MIN_COLUMNS, bucket
from turngym.agents.hf.registry import COMPILE_SETTINGS
from turngym.agents.hf.runner.attention import slot_attention_on

log = logging.getLogger(__name__)


class DecodeGraphs:
    """The captured decode blocks of ``runner`` (``enabled``: capture at all) and its compiled
    model pass (``compile``: the setting, None when off)."""

    def __init__(self, runner: Any, enabled: bool, compile: str | None):
        self.runner, self.enabled, self.compile = runner, enabled, compile
        self.graphs: dict[tuple[int, int, bool, int], Any] = {}  # (width, context, filtered, steps)
        self.pool: Any = None
        self.compiled: Any = None  # the compiled model pass of a decode step, made on first use
        self.compiled_buckets: set[tuple[int, int]] = set()  # (width, context): no sampling inside
        # dynamo keeps one entry per bucket a static setting compiles: room for every bucket
        slots, context = runner.max_batch_size, runner.max_context
        widths = len({bucket(n, 1, slots) for n in range(1, slots + 1)})
        contexts = len({bucket(n, MIN_COLUMNS, context) for n in range(1, context + 1)})
        self.recompile_limit = 2 * widths * contexts + 8

    def memory_pool(self) -> Any:
        """The graphs' memory pool (decode and prefill graphs share it), made on first use."""
        if self.pool is None:
            import torch

            self.pool = torch.cuda.graph_pool_handle()
        return self.pool

    def clear(self) -> None:
        self.graphs.clear()
        self.pool = None

    def body(self) -> Any:
        """The decode body to run: with the model pass compiled (``compile`` on; compiling on its
        first call for a bucket) or plain."""
        r = self.runner
        if self.compile is None:
            return r.decode_body
        if self.compiled is None:
            import torch

            self.compiled = torch.compile(r.decode_logits, **COMPILE_SETTINGS[self.compile])
        return functools.partial(r.decode_body, logits_fn=self.compiled)

    def step(self, w: int, k: int, filtered: bool, n: int) -> None:
        """One decode body, outside a capture: compiled when ``compile`` is on (the bucket's first
        call compiles it, timed in ``stats``); a compile that fails turns compiling off for this
        backend, with a warning and ``stats["compile_fallbacks"]``, and runs the plain body."""
        r = self.runner
        eng = self.runner.engine
        if self.compile is None:
            r.decode_body(w, k, filtered, n)
            return
        import torch

        first = (w, k) not in self.compiled_buckets
        t0 = time.perf_counter()
        try:
            # static settings keep one dynamo entry per bucket: room for every bucket
            with torch._dynamo.config.patch(recompile_limit=self.recompile_limit):
                self.body()(w, k, filtered, n)
        except Exception as e:  # noqa: BLE001 - no compiler, an op inductor cannot lower, a crash
            self.compile, self.compiled = None, None
            eng.stats["compile_fallbacks"] += 1
            why = str(e).strip().splitlines()
            log.warning(
                "torch.compile of the decode step failed (%s: %s); running it uncompiled from now on",
                type(e).__name__,
                why[0] if why else "",
            )
            r.decode_body(w, k, filtered, n)
            return
        if first:
            self.compiled_buckets.add((w, k))
            eng.stats["compiles"] += 1
            eng.stats["compile_s"] += time.perf_counter() - t0

    def graph(self, w: int, k: int, filtered: bool, n: int) -> Any:
        """The captured decode block for (w, k, top-k/top-p filtering or not, n steps), captured on
        first use; None (and graphs off, with a warning) when a capture fails."""
        r = self.runner
        eng = self.runner.engine
        graph = self.graphs.get((w, k, filtered, n))
        if graph is not None:
            return graph
        import torch

        t0 = time.perf_counter()
        try:
            # warm-up: one step of the block's own inputs (its kernels are every step's), so its KV
            # write is the block's own; it samples into ``ids``, which get the block's inputs back after
            pending = r.ids.clone()
            side = torch.cuda.Stream(device=r.device)
            side.wait_stream(torch.cuda.current_stream(r.device))
            with torch.cuda.stream(side):
                self.step(w, k, filtered, 1)  # compiles the bucket's body (compile on), or falls back
            torch.cuda.current_stream(r.device).wait_stream(side)
            r.ids.copy_(pending)
            body = self.body()  # compiled (the warm-up compiled this bucket) or plain
            graph = torch.cuda.CUDAGraph()
            with (
                torch._dynamo.config.patch(recompile_limit=self.recompile_limit),
                torch.cuda.graph(graph, pool=self.memory_pool(), capture_error_mode="thread_local"),
            ):
                body(w, k, filtered, n)
        except Exception as e:  # noqa: BLE001 - out of memory or an op that cannot be captured
            self.enabled = False
            self.graphs.clear()
            eng.stats["graph_fallbacks"] += 1
            torch.cuda.synchronize(r.device)
            torch.cuda.empty_cache()
            log.warning(
                "CUDA graph capture failed (%s: %s); decoding eagerly from now on", type(e).__name__, e
            )
            return None
        self.graphs[(w, k, filtered, n)] = graph
        eng.stats["graph_captures"] += 1
        eng.stats["capture_s"] += time.perf_counter() - t0
        return graph

    def precapture(self, context: int | None = None, filtered: tuple[bool, ...] = (False,)) -> int:
        """Capture now the decode graphs of every width bucket, every context bucket up to
        ``context`` (default ``max_context``) and both block sizes (and each ``filtered``: whether
        top-k/top-p rows take part), so that no capture (0.1-0.3 s each with 8-step blocks on an
        H100/H200) lands inside a latency-sensitive or measured run; how many it captured (0 without
        CUDA graphs). Safe while serving: it holds the model lock between passes, and its warm-ups
        write only the scratch column, restoring the step inputs after."""
        r = self.runner
        eng = self.runner.engine
        if not self.enabled:
            return 0
        import torch

        r.inputs()
        top = min(context or r.max_context, r.max_context)
        widths = sorted({bucket(n, 1, r.max_batch_size) for n in range(1, r.max_batch_size + 1)})
        contexts = sorted({bucket(n, MIN_COLUMNS, r.max_context) for n in range(1, top + 1)})
        before = eng.stats["graph_captures"]
        with eng.lock, torch.inference_mode(), eng.kernels(), slot_attention_on(eng.model):
            if r.fast is not None:
                r.fast.refresh()
            saved_in, saved_ids = r.step_in.clone(), r.ids.clone()
            try:
                r.step_in[0].fill_(r.max_context)  # the warm-ups' KV writes: the scratch column
                for w in widths:
                    for k in contexts:
                        for f in filtered:
                            for n in sorted({1, r.decode_block}):
                                if self.enabled and (w, k, f, n) not in self.graphs:
                                    self.graph(w, k, f, n)
            finally:
                r.step_in.copy_(saved_in)
                r.ids.copy_(saved_ids)
        return eng.stats["graph_captures"] - before
