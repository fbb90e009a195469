"""The slots engine's scheduler: each iteration places the joiners in slots and prefills them
(``PrefillPlan``s), then plans one decode block for every live row (``DecodePlan``), and retires
the finished rows after each.

* **Place.** A joiner takes its route's parked slot when its prompt extends what that row holds
  (feeding only the rest), else the lowest free slot, evicting the oldest parked row when none is
  free; stale, released and expired parked rows are freed first. A fork's first request starts from
  a copy of its donor's row (``scheduler.sharing``).
* **Prefill** in passes of at most ``prefill_tokens`` (rows x longest feed); a failing pass is
  retried row by row, so only the culprit fails. With ``overlap_prefill`` the decode block is queued
  behind a prefill pass without reading its first tokens first (one wait for both); a joiner whose
  first token ends it rides that block and keeps none of its tokens.
* **Decode blocks**: slots ``0..w-1``, ``w`` the smallest power of two (or the slot count) past the
  highest live slot; the first ``k`` columns, ``k`` the smallest bucket (64 * 2^i, or
  ``max_context``) past every live row's position. A parked or empty slot inside the window
  computes a throw-away token whose write the row's own later feed overwrites before anything reads it.
* **Retire**: rows that finished, ran out of tokens or reached ``max_context`` are delivered, those
  with a route parked in their slot; the slots of rows whose caller gave up are freed.
"""

from __future__ import annotations

import time

from turngym.agents.backend import BackendError
from turngym.agents.hf.kv.slots import SlotBatch, SlotKV
from turngym.agents.hf.parts import Engine
from turngym.agents.hf.plan import MIN_COLUMNS, DecodePlan, PrefillPlan, bucket
from turngym.agents.hf.request import Request, backend_error, common_prefix
from turngym.agents.hf.runner.slots import SlotRunner
from turngym.agents.hf.scheduler.sharing import SlotSharing


class SlotScheduler:
    """Schedules ``engine``'s requests over the slots of ``kv``, passes run by ``runner``."""

    def __init__(
        self, engine: Engine, kv: SlotKV, runner: SlotRunner, *, prefill_tokens: int, overlap_prefill: bool
    ):
        self.engine, self.kv, self.runner = engine, kv, runner
        self.sharing = SlotSharing(engine, kv)
        self.prefill_tokens, self.overlap_prefill = prefill_tokens, overlap_prefill
        self.after: dict[int, Request] = {}  # fork slot -> donor placed in the same iteration (place)

    def new_batch(self) -> SlotBatch:
        self.runner.first = []
        return SlotBatch([None] * self.kv.slots)

    def iterate(self, batch: SlotBatch, joiners: list[Request]) -> None:
        """Place the joiners in slots and prefill them, then one decode step for every live row;
        finished rows are delivered after each."""
        joiners = [r for r in joiners if not r.gave_up()]
        placed = self.place(batch, joiners)
        if placed:
            self.prefill(batch, placed)
            if not self.overlap_prefill or any(self.ends_at_first(batch, s, r) for s, r in placed):
                self.runner.first_tokens()
                self.retire(batch)
        live = batch.live()
        if not live:
            if self.runner.first:
                self.runner.first_tokens()
                self.retire(batch)
            return
        try:
            self.runner.decode(batch, self.plan_decode(batch, live))
        except Exception as e:  # noqa: BLE001 - every live row gets the error, the thread survives
            self.runner.first = []
            err = backend_error(e)
            for s in live:
                batch.slots[s].done(err)  # type: ignore[union-attr]
                batch.free(s)
            return
        self.retire(batch)

    def ends_at_first(self, batch: SlotBatch, s: int, r: Request) -> bool:
        """Whether a row just prefilled ends with its first token whatever it is (its ``max_tokens``
        or the end of the context): it is delivered before the decode block instead of riding it."""
        return r.sampling.max_tokens <= 1 or batch.lengths[s] >= self.kv.max_context

    def place(self, batch: SlotBatch, joiners: list[Request]) -> list[tuple[int, Request]]:
        """A slot for each joiner: its route's parked row when the prompt extends what that row holds
        (it then feeds only the prompt after the reused prefix), else the lowest free slot, evicting
        the oldest parked row when none is free. Parked rows that expired, were released, hold KV of
        older weights or an older prefix-cache epoch, or lost their route's reuse, are freed. A fresh
        request of a forked route (``share_prefix``) starts from a copy of its donor's row, or waits
        for the prefill of a donor placed now (``scheduler.sharing``)."""
        eng = self.engine
        now = time.perf_counter()
        released = eng.take_released()
        parked: dict[str | None, int] = {}
        for s, r in enumerate(batch.slots):
            if r is None or r.parked is None:
                continue
            if not eng.may_resume(r, released, now):
                batch.free(s)
                eng.stats["parked_dropped"] += 1
            else:
                parked[r.route] = s
        donors = self.sharing.donor_rows(batch)  # before any slot changes hands: the KV each holds now
        placed: list[tuple[int, Request]] = []
        fresh: list[Request] = []
        for r in joiners:
            s = parked.pop(r.route, None) if r.route is not None else None
            if s is not None:
                held = batch.slots[s].cached_ids  # type: ignore[union-attr]
                r.reuse = min(common_prefix(held, r.prompt_ids), len(r.prompt_ids) - 1)
                if r.reuse > 0:
                    batch.slots[s] = r
                    placed.append((s, r))
                    continue
                batch.free(s)
                eng.stats["parked_dropped"] += 1
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
                eng.stats["parked_dropped"] += 1
                eng.stats["parked_evicted"] += 1
            r.reuse = self.sharing.share_row(donors, r, s, copies, joining)
            batch.slots[s] = r
            placed.append((s, r))
        if copies:
            self.kv.copy_rows(copies)
        self.after = self.sharing.after_donors(placed, joining) if joining else {}
        return placed

    def prefill(self, batch: SlotBatch, placed: list[tuple[int, Request]]) -> None:
        """Feed the placed rows; forks whose donor was placed now too (``after``) after it, from a
        copy of its row."""
        after, self.after = self.after, {}
        self.prefill_rows(batch, [(s, r) for s, r in placed if s not in after])
        if after:
            self.runner.first_tokens()  # a fork copies a donor whose prefill gave it a token
            self.sharing.share_joined(batch, after)
            self.prefill_rows(batch, [(s, r) for s, r in placed if s in after])

    def prefill_rows(self, batch: SlotBatch, placed: list[tuple[int, Request]]) -> None:
        """Feed the rows in passes of at most ``prefill_tokens`` (rows x longest feed); a failing
        pass is retried row by row, so only the culprit fails."""
        group: list[tuple[int, Request]] = []
        longest = 0
        for s, r in sorted(placed, key=lambda p: len(p[1].prompt_ids) - p[1].reuse):
            n = len(r.prompt_ids) - r.reuse
            if group and (len(group) + 1) * max(longest, n) > self.prefill_tokens:
                self.prefill_group(batch, group)
                group, longest = [], 0
            group.append((s, r))
            longest = max(longest, n)
        if group:
            self.prefill_group(batch, group)

    def prefill_group(self, batch: SlotBatch, group: list[tuple[int, Request]]) -> None:
        try:
            self.runner.prefill(batch, PrefillPlan(group))
        except Exception as e:  # noqa: BLE001
            if len(group) > 1:
                for one in group:
                    self.prefill_group(batch, [one])
                return
            s, r = group[0]
            r.done(backend_error(e))
            batch.free(s)

    def plan_decode(self, batch: SlotBatch, live: list[int]) -> DecodePlan:
        """The next decode block of the ``live`` slots: a full block (``decode_block`` steps) while
        some row has that many tokens left, else single steps (two block sizes a (width, context)
        bucket, so few graphs to capture); the width and context buckets; each slot's first token
        index (a first token still on the device counts)."""
        rows = [batch.slots[s] for s in live]
        unread = {r for queued, *_ in self.runner.first for r in queued}  # first token still on the device
        had = [len(r.tokens) + (r in unread) for r in rows]  # type: ignore[union-attr]
        left = max(r.sampling.max_tokens - h for r, h in zip(rows, had, strict=True))  # type: ignore[union-attr]
        block = self.runner.decode_block
        n = block if left >= block else 1
        w = bucket(max(live) + 1, 1, self.kv.slots)
        k = bucket(max(batch.lengths[s] for s in live) + n, MIN_COLUMNS, self.kv.max_context)
        filtered = any(r.filtered for r in rows)  # type: ignore[union-attr]
        index = [0] * w
        for s, h in zip(live, had, strict=True):
            index[s] = h
        return DecodePlan(live, w, k, n, filtered, index)

    def retire(self, batch: SlotBatch) -> None:
        """Deliver finished rows (done, out of tokens, or at the end of the context), parking those
        with a route in their slot; free the slots of rows whose caller gave up."""
        eng = self.engine
        park = eng.reuse_prefix and eng.park_s > 0
        for s, r in enumerate(batch.slots):
            if r is None or r.parked is not None:
                continue
            if r.finished or batch.lengths[s] >= self.kv.max_context:
                if not eng.deliver(r, park):
                    batch.free(s)
            elif r.gave_up():
                batch.free(s)
        eng.iteration_done()

    # ------------------------------------------------------------- buffers
