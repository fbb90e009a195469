"""The slots engine's runner: carries out ``PrefillPlan``s and ``DecodePlan``s on the KV slots.

* **Inputs.** Each slot's next input, sampling settings and seed live in static device tensors (one
  spare entry past the slots, where a prefill graph's padding rows put theirs), so a decode step
  reads the same storage every time and can be replayed from a CUDA graph (``runner.graphs``).
* **Prefill** without a round trip: a pass's inputs go up from pinned memory without waiting for the
  device, its first tokens are sampled into the decode inputs on the device, and the host reads
  them with the next decode block (``first_tokens``). A pass whose bucket comes back is replayed
  from a graph (``runner.prefill_graphs``).
* **Decode blocks**: one replay runs ``decode_block`` steps, each writing the next column and
  sampling with the draw of the next token index (``sampling.pick`` inside the step), so the host
  waits for the device once a block; a row that finishes inside a block keeps its tokens up to its end.
* **The forward** is ``kernels.fast`` where the model allows it, else transformers' with the slots
  attention (``slot_attention``, registered with transformers as ``"turngym_slots"`` and switched
  on only during this engine's passes): grouped-query attention as two matmuls straight on the
  cache buffers for a decode step, SDPA for prefill.
"""

from __future__ import annotations

import time
from typing import Any

from turngym.agents.hf.kernels import triton
from turngym.agents.hf.kv.slots import SlotBatch, SlotCache, SlotKV
from turngym.agents.hf.parts import Engine
from turngym.agents.hf.plan import MIN_COLUMNS, DecodePlan, PrefillPlan
from turngym.agents.hf.request import Request
from turngym.agents.hf.runner.attention import register_attention, slot_attention_on
from turngym.agents.hf.runner.eager import last_logits_pass
from turngym.agents.hf.runner.graphs import DecodeGraphs
from turngym.agents.hf.runner.prefill_graphs import PrefillGraphs
from turngym.agents.hf.sampling import LOW32, pick, seeded_uniform, seeded_uniforms

PREFILL_INTS = 6  # a prefill row's integer inputs after its ids and columns (``prefill_inputs``)


class SlotRunner:
    """Runs the slots engine's plans for ``engine`` (its model, lock, weights version, stats and
    trace) on ``kv``; ``fast``: the fast forward or None (transformers' forward)."""

    def __init__(
        self,
        engine: Engine,
        kv: SlotKV,
        fast: Any,
        *,
        decode_block: int,
        cuda_graphs: bool,
        compile: str | None,
        prefill_graph_tokens: int,
    ):
        self.engine, self.kv, self.fast = engine, kv, fast
        self.device, self.max_context, self.max_batch_size = engine.device, kv.max_context, kv.slots
        self.decode_block = decode_block
        # prefill passes whose first tokens are still on the device: (rows, [2, rows] tokens and
        # logprobs, weights version, when queued)
        self.first: list[tuple[list[Request], Any, int, float]] = []
        self.ids: Any = None  # made with the KV buffers (``inputs``)
        self.graphs = DecodeGraphs(self, cuda_graphs, compile)
        self.prefill_graphs = PrefillGraphs(self, prefill_graph_tokens)
        register_attention()

    def inputs(self) -> SlotCache:
        """The KV buffers and the graphs' static inputs and outputs, made on first use (after an
        engine's sleep only what it dropped: the graphs it kept read the rest at their addresses)."""
        if self.kv.cache is not None and self.ids is not None:
            return self.kv.cache
        import torch

        cache = self.kv.buffers()
        if self.ids is not None:
            return cache
        slots, dev = self.max_batch_size, self.device
        spare = slots + 1
        self.ids = torch.full((spare,), self.engine.pad_id, dtype=torch.long, device=dev)
        self.step_in = torch.zeros((2, slots), dtype=torch.long, device=dev)  # positions, token indices
        self.seeds = torch.zeros((2, spare), dtype=torch.long, device=dev)  # each seed's low, high 32 bits
        # step j of a block: tokens, logprobs
        self.step_out = torch.zeros((self.decode_block, 2, slots), dtype=torch.float64, device=dev)
        self.temp = torch.ones(spare, device=dev)
        self.greedy = torch.ones(spare, dtype=torch.bool, device=dev)
        self.top_k = torch.zeros(spare, dtype=torch.long, device=dev)
        self.top_p = torch.ones(spare, device=dev)
        return cache

    def free(self) -> None:
        """Give the KV slots, the static inputs and the captured graphs back to the device."""
        self.kv.free()
        self.ids = None
        self.graphs.clear()
        self.prefill_graphs.clear()

    def pinned(self, host: Any) -> Any:
        """``host`` (a CPU tensor) in page-locked memory when the device is CUDA, so a copy to the
        device can be queued without waiting for the device (``non_blocking``)."""
        return host.pin_memory() if self.device.type == "cuda" else host

    def up(self, host: Any) -> Any:
        """``host`` on the device, its copy queued behind the device's work, not waited for."""
        return self.pinned(host).to(self.device, non_blocking=True)

    def first_tokens(self) -> None:
        """Append the first token and raw logprob of each row of the prefill passes read back now
        (one wait for the device: the passes were queued before)."""
        first, self.first = self.first, []
        for rows, out, version, at in first:
            host = out.tolist()
            for r, t, lp in zip(rows, host[0], host[1], strict=True):
                if not r.tokens:
                    r.first_token = at
                r.tokens.append(int(t))
                r.logprobs.append(lp)
                r.versions.append(version)

    def prefill(self, batch: SlotBatch, plan: PrefillPlan) -> None:
        """One pass, eager or replayed from its bucket's graph (``runner.prefill_graphs``): every row's feed
        right-aligned in one window, written at its columns ``start..``; padded queries (and a
        graph's padding rows) write to the scratch column and attend to column 0 only. The host
        builds two small tensors (``prefill_inputs``) and queues their copies and the pass
        (``prefill_body``: the rows' sampling settings into their slots, the forward, the first
        tokens into the decode inputs); the tokens are read with the next decode block."""
        import torch

        eng = self.engine
        self.inputs()
        group = plan.rows
        feeds = [(s, r.prompt_ids[r.reuse :], r.reuse) for s, r in group]
        rows = [r for _, r in group]
        width = max(len(f) for _, f, _ in feeds)
        span = max(start + len(f) for _, f, start in feeds)
        filtered = any(r.filtered for r in rows)
        key = self.prefill_graphs.bucket(
            len(feeds), width, span, MIN_COLUMNS, filtered
        )  # None: eager, unpadded
        n_rows, n_cols = (key[0], key[1]) if key else (len(feeds), width)
        ints, floats = self.prefill_inputs(feeds, rows, n_rows, n_cols)
        t0, c0 = time.perf_counter(), time.thread_time()
        with eng.lock, torch.inference_mode(), eng.kernels(), slot_attention_on(eng.model):
            if self.fast is not None:
                self.fast.refresh()
            out = self.prefill_graphs.replay(key, ints, floats) if key else None
            if out is None:
                out = self.prefill_body(self.up(ints), self.up(floats), span, filtered)
            out = out[:, : len(feeds)].clone()  # a graph's output is overwritten by its next replay
            version = eng.weights_version
        t_fwd = time.perf_counter()
        self.first.append((rows, out, version, t_fwd))
        for s, f, start in feeds:
            batch.lengths[s] = start + len(f)
            batch.slots[s].admitted = t0  # type: ignore[union-attr]
        eng.stats["prefills"] += 1
        eng.stats["prompt_tokens"] += sum(len(f) for _, f, _ in feeds)
        eng.stats["reused_tokens"] += sum(r.reuse for r in rows)
        if eng.trace is not None:
            shape = (batch.active, len(group), width, span)
            cpu = time.thread_time() - c0
            eng.trace.append(("pass", t0, time.perf_counter(), "prefill", *shape, cpu, t_fwd - t0))

    def prefill_inputs(
        self, feeds: list[tuple[int, list[int], int]], rows: list[Request], n_rows: int, n_cols: int
    ) -> tuple[Any, Any]:
        """A pass's inputs as two host tensors built from plain lists (one tensor op each, however
        many rows): int64 ``[n_rows, 2 * n_cols + PREFILL_INTS]`` (ids, columns, then slot,
        settings slot, top-k, greedy, the seed's low and high 32 bits) and float32 ``[n_rows, 3]``
        (temperature, top-p, the first token's draw). Padding rows (``prefill_padding``) feed the pad
        id at the scratch column of slot 0 and keep their settings and token in the spare slot."""
        import torch

        eng = self.engine
        scratch = self.max_context
        ints: list[list[int]] = []
        floats: list[list[float]] = []
        for (s, f, start), r in zip(feeds, rows, strict=True):
            pad, sp = n_cols - len(f), r.sampling
            ids = [eng.pad_id] * pad + list(f)
            cols = [scratch] * pad + list(range(start, start + len(f)))
            ints.append(ids + cols + [s, s, sp.top_k, int(sp.greedy), r.seed & LOW32, (r.seed >> 32) & LOW32])
            floats.append([1.0 if sp.greedy else sp.temperature, sp.top_p, seeded_uniform(r.seed, 0)])
        pad_ints, pad_floats = self.prefill_padding(n_cols)
        ints += [pad_ints] * (n_rows - len(feeds))
        floats += [pad_floats] * (n_rows - len(feeds))
        return torch.tensor(ints, dtype=torch.long), torch.tensor(floats, dtype=torch.float32)

    def prefill_padding(self, n_cols: int) -> tuple[list[int], list[float]]:
        """A padding row's inputs: the pad id at slot 0's scratch column, greedy, its settings and
        token in the spare slot past the last."""
        eng = self.engine
        ints = [eng.pad_id] * n_cols + [self.max_context] * n_cols + [0, self.max_batch_size, 0, 1, 0, 0]
        return ints, [1.0, 1.0, 0.5]

    def prefill_body(self, ints: Any, floats: Any, span: int, filtered: bool) -> Any:
        """A prefill pass on the device, from its inputs (``prefill_inputs``, on the device) to
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
        self.temp[home], self.greedy[home], self.top_k[home], self.top_p[home] = (
            temp,
            greedy,
            top_k,
            top_p,
        )
        self.seeds[0, home], self.seeds[1, home] = lo, hi
        logits = self.prefill_logits(ids, cols, slots, span)
        tok, lp = self.pick(logits, temp, greedy, top_k, top_p, u, filtered)
        self.ids[home] = tok
        return torch.stack([tok.double(), lp.double()])

    def prefill_logits(self, ids: Any, cols: Any, slots: Any, span: int) -> Any:
        """A prefill pass's logits (each row's last position): ``ids`` and ``cols`` ``[rows, feed]``
        on the device (a padded query's column is the scratch column), ``slots`` ``[rows]``, the
        first ``span`` columns attended; the forward of ``prefill_body``."""
        import torch

        cache = self.kv.cache
        assert cache is not None
        real = cols < self.max_context
        pos = torch.where(real, cols, 0)
        keys = self.kv.columns[:span]
        mask = torch.where(real[:, :, None], keys <= cols[:, :, None], keys == 0)[:, None]
        cache.index = self.kv.row_base[slots][:, :, None] + cols[:, None, :]
        cache.rows, cache.columns = slots, span
        return self.logits(ids, mask, pos, cache)

    def decode(self, batch: SlotBatch, plan: DecodePlan) -> None:
        """One decode block for every live row: ``n`` steps (``decode_block``, or 1 when no live row
        has that many tokens left) over slots ``0..w-1`` and the first ``k`` columns
        (buckets), sampling included, replayed from one CUDA graph when graphs are on. The host sends
        one small tensor (each slot's position and token index) and reads one back (``n`` tokens and
        logprobs a slot); a row that finishes inside the block keeps only its tokens up to there."""
        import torch

        eng = self.engine
        self.inputs()
        live, w, k, n = plan.live, plan.width, plan.columns, plan.steps
        rows = [batch.slots[s] for s in live]
        self.step_in[:, :w].copy_(
            self.pinned(torch.tensor([batch.lengths[:w], plan.index])), non_blocking=True
        )
        t0, c0 = time.perf_counter(), time.thread_time()
        with eng.lock, torch.inference_mode(), eng.kernels(), slot_attention_on(eng.model):
            if self.fast is not None:
                self.fast.refresh()  # the concatenated weights, if the model's changed
            graph = self.graphs.graph(w, k, plan.filtered, n) if self.graphs.enabled else None
            if graph is not None:
                graph.replay()
                eng.stats["graph_replays"] += 1
            else:
                self.graphs.step(w, k, plan.filtered, n)
                eng.stats["eager_decodes"] += 1
            version = eng.weights_version
        t_fwd = time.perf_counter()
        out = self.step_out[:n, :, :w].tolist()  # the block's only wait for the device
        self.first_tokens()  # the prefill passes queued before the block are done too
        used = 0
        for s, r in zip(live, rows, strict=True):
            took = self.take(
                r,
                [out[j][0][s] for j in range(n)],
                [out[j][1][s] for j in range(n)],
                version,
                batch.lengths[s],
            )  # type: ignore[arg-type]
            batch.lengths[s] += took
            used = max(used, took)
        eng.stats["steps"] += n
        eng.stats["decode_blocks"] += 1
        eng.stats["block_steps_unused"] += n - used
        eng.stats["widths"][len(live)] += n
        if eng.trace is not None:
            cpu = time.thread_time() - c0
            eng.trace.append(
                ("pass", t0, time.perf_counter(), "decode", len(live), 0, w, k, cpu, t_fwd - t0, n)
            )

    def take(self, r: Request, tokens: list[float], logprobs: list[float], version: int, length: int) -> int:
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

    def decode_logits(self, w: int, k: int, pos: Any = None) -> Any:
        """The model's pass of a decode step over slots ``0..w-1`` and ``k`` columns, from the static
        inputs (``ids``; positions ``pos``, default ``step_in``'s) to the last position's fp32
        logits: the part ``compile`` fuses."""
        cache = self.kv.cache
        assert cache is not None
        if pos is None:
            pos = self.step_in[0, :w]
        pos = pos[:, None]
        ids = self.ids[:w, None]
        cache.index = (self.kv.row_base[:w] + pos)[:, :, None]
        cache.rows, cache.width, cache.columns = None, w, k
        mask = (self.kv.columns[None, :k] <= pos)[:, None, None, :]
        return self.logits(ids, mask, pos, cache)

    def logits(self, ids: Any, mask: Any, pos: Any, cache: SlotCache) -> Any:
        """The pass's fp32 logits at each row's last position: the fast forward, or transformers'."""
        eng = self.engine
        if self.fast is not None:
            return self.fast.logits(ids, pos, cache, mask)
        return last_logits_pass(eng.model, ids, mask, pos, cache).logits[:, -1].float()

    def decode_body(self, w: int, k: int, filtered: bool, n: int = 1, logits_fn: Any = None) -> None:
        """``n`` decode steps of slots ``0..w-1`` over ``k`` columns, from the static inputs
        (``ids``; ``step_in``: positions and token indices; the slots' seeds and sampling
        settings) to the static outputs (``step_out[j]``: step ``j``'s tokens and raw logprobs;
        ``ids``: the next block's inputs); what a graph captures. Step ``j`` writes column
        position + ``j`` (past ``max_context``: the scratch column) and samples with the draw of
        token index + ``j``. ``logits_fn``: the (compiled) model pass; sampling stays eager, since
        inductor cannot lower an argmax over a 49k vocabulary on every version (torch 2.11:
        "NYI TritonSplitDimKernel reductions") and the sampling is a few kernels."""
        import torch

        pos0, index0 = self.step_in[0, :w], self.step_in[1, :w]
        steps = torch.arange(n, device=pos0.device)[:, None]
        draws = seeded_uniforms(self.seeds[0, :w], self.seeds[1, :w], index0[None, :] + steps)
        for j in range(n):
            pos = (pos0 + j).clamp(max=self.max_context)
            logits = (logits_fn or self.decode_logits)(w, k, pos)
            tok, lp = self.pick(
                logits, self.temp[:w], self.greedy[:w], self.top_k[:w], self.top_p[:w], draws[j], filtered
            )
            self.ids[:w].copy_(tok)
            self.step_out[j, 0, :w].copy_(tok)
            self.step_out[j, 1, :w].copy_(lp)

    def pick(
        self, logits: Any, temp: Any, greedy: Any, top_k: Any, top_p: Any, u: Any, filtered: bool
    ) -> tuple[Any, Any]:
        """``pick``, or with the fast forward's Triton kernels and no top-k/top-p row, its one-kernel
        sampler (``kernels.triton.sample``: the softmax, cumulative sum and search of ``pick`` were a
        quarter of a 256-row decode step on an H200)."""
        fast = self.fast
        if not filtered and fast is not None and fast.kernels != "torch":
            return triton.sample(logits, temp, greedy, u, interpret=fast.kernels == "interpret")
        return pick(logits, temp, greedy, top_k, top_p, u, filtered)
