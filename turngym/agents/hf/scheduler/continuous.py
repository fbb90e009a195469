"""The continuous engine's scheduler: each iteration places the joiners, plans one pass
(``StepPlan``) and retires the finished rows.

* **Admit.** Fresh joiners are prefilled in the same pass as the running rows' decode step when the
  padding that costs (rows x longest prompt) fits ``fuse_tokens``; otherwise in a pass of their own,
  merged in after (a failing group retried one by one, so only the culprit fails).
* **Park and resume.** A finished request with a route stays as a parked row holding its KV; the
  route's next request resumes it when its prompt extends those ids (a diverging prompt reuses the
  common prefix, the row's later columns masked). Parked rows are dropped when released, expired,
  stale (older weights or prefix-cache epoch), or the oldest when fresh rows need room.
* **Share.** A fork's first request (``share_prefix``) starts from a copy of its donor's row.
"""

from __future__ import annotations

import copy
import time

from turngym.agents.hf.kv.padded import Batch, PaddedKV
from turngym.agents.hf.parts import Engine
from turngym.agents.hf.plan import StepPlan
from turngym.agents.hf.request import Request, backend_error, common_prefix
from turngym.agents.hf.runner.eager import EagerRunner


class ContinuousScheduler:
    """Schedules ``engine``'s requests over one padded batch (``kv``), passes run by ``runner``."""

    def __init__(self, engine: Engine, kv: PaddedKV, runner: EagerRunner):
        self.engine, self.kv, self.runner = engine, kv, runner

    def new_batch(self) -> Batch:
        return self.kv.new_batch()

    def iterate(self, batch: Batch, joiners: list[Request]) -> None:
        """One scheduler iteration: place the joiners (see ``plan``), one forward pass for every row
        that feeds, retire the finished.

        Fresh joiners are prefilled in the same pass as the other rows' decode step when the padding
        that costs (rows x longest prompt) fits ``fuse_tokens``; otherwise in a prefill pass of their
        own, merged in after."""
        eng = self.engine
        joiners = [r for r in joiners if not r.gave_up()]
        resumes, fresh = self.plan(batch, joiners)
        fuse = bool(fresh and batch.rows)
        if fuse:
            width = max(len(r.prompt_ids) for r in fresh)
            fuse = len(batch.rows) * (width - 1) <= eng.fuse_tokens
        if fresh and not fuse:
            self.admit(batch, fresh)
        fused = fresh if fuse else []
        if not (batch.active or resumes or fused):  # fused joiners may join a batch of parked rows
            return
        try:
            self.runner.forward(batch, StepPlan(resumes, fused))
        except Exception as e:  # noqa: BLE001 - every live row gets the error, the thread survives
            err = backend_error(e)
            for r in [*batch.rows, *resumes.values(), *fused]:
                if r.parked is None:
                    r.done(err)
            batch.__init__()  # type: ignore[misc]
            return
        self.retire(batch)
        if self.kv.compact(batch):
            eng.stats["compactions"] += 1

    def plan(self, batch: Batch, joiners: list[Request]) -> tuple[dict[int, Request], list[Request]]:
        """Give each joiner a row: its route's parked row when the prompt extends what that row holds
        (it then feeds only the prompt after the reused prefix), else a fresh row. Parked rows that
        expired (``park_s``), were released, hold KV of older weights or an older
        ``reset_prefix_cache`` epoch, lost their route's reuse, or are the oldest when fresh rows
        need room, are dropped.

        Resuming is skipped (all joiners fresh) when the padding it costs the other rows exceeds
        ``fuse_tokens`` plus the prompt tokens it saves. Returns (row index -> request, fresh)."""
        eng = self.engine
        now = time.perf_counter()
        released = eng.take_released()
        parked: dict[str | None, int] = {}
        drop: set[int] = set()
        for i, r in enumerate(batch.rows):
            if r.parked is None:
                continue
            if not eng.may_resume(r, released, now):
                drop.add(i)
            else:
                parked[r.route] = i
        resumes: dict[int, Request] = {}
        fresh: list[Request] = []
        for r in joiners:
            i = parked.pop(r.route, None) if r.route is not None else None
            if i is not None:
                r.reuse = min(common_prefix(batch.rows[i].cached_ids, r.prompt_ids), len(r.prompt_ids) - 1)
                if r.reuse > 0:
                    resumes[i] = r
                    continue
                drop.add(i)
            fresh.append(r)
        if resumes:
            width = max(len(r.prompt_ids) - r.reuse for r in resumes.values())
            padding = (len(batch.rows) - len(resumes)) * (width - 1)
            if padding > eng.fuse_tokens + sum(r.reuse for r in resumes.values()):
                for r in resumes.values():
                    r.reuse = 0
                drop.update(resumes)
                fresh += resumes.values()
                resumes = {}
        unclaimed = sorted((batch.rows[i].parked, i) for i in parked.values() if i not in drop)
        over = len(batch.rows) - len(drop) + len(fresh) - eng.max_batch_size
        evicted = [i for _, i in unclaimed[: max(0, over)]]
        eng.stats["parked_evicted"] += len(evicted)
        drop.update(evicted)
        if drop:
            keep = [i for i in range(len(batch.rows)) if i not in drop]
            eng.stats["parked_dropped"] += len(drop)
            self.kv.keep(batch, keep)
            new_index = {old: j for j, old in enumerate(keep)}
            resumes = {new_index[i]: r for i, r in resumes.items()}
        if eng.donors and eng.reuse_prefix and fresh:
            fresh = self.share(batch, resumes, fresh)
        for i, r in resumes.items():
            if r.reuse < len(batch.rows[i].cached_ids):  # the prompt diverges: mask the row's later tokens
                self.kv.mask_after(batch, i, r.reuse)
        return resumes, fresh

    def share(self, batch: Batch, resumes: dict[int, Request], fresh: list[Request]) -> list[Request]:
        """Fresh requests of forked routes (``share_prefix``) whose donor route has a row in the batch
        (parked or running, KV of the current weights) get a copy of that row and resume it like a
        parked row of their own (added to ``resumes``); returns the others."""
        eng = self.engine
        rows = {r.route: i for i, r in enumerate(batch.rows) if r.route is not None}
        rest = []
        for r in fresh:
            src = eng.donors.pop(r.route, None) if r.route is not None else None
            i = rows.get(src) if src is not None else None
            donor = batch.rows[i] if i is not None else None
            if donor is None or not donor.versions or donor.versions[-1] != eng.weights_version:
                rest.append(r)
                continue
            if donor.parked is not None and donor.epoch != eng.epoch:
                rest.append(r)
                continue
            reuse = min(common_prefix(donor.cached_ids, r.prompt_ids), len(r.prompt_ids) - 1)
            if reuse <= 0:
                rest.append(r)
                continue
            self.kv.copy_row(batch, i)
            holder = copy.copy(donor)  # stands for the copied row until ``forward`` puts ``r`` there
            holder.tokens, holder.route = list(donor.tokens), r.route
            holder.parked = holder.parked if holder.parked is not None else time.perf_counter()
            batch.rows.append(holder)
            r.reuse = reuse
            resumes[len(batch.rows) - 1] = r
            eng.stats["shared_rows"] += 1
        return rest

    def admit(self, batch: Batch, joiners: list[Request]) -> None:
        """Prefill the joiners in a pass of their own and merge them in; a failing group is retried
        one by one so only the culprit fails."""
        part = self.kv.new_batch()
        try:
            self.runner.forward(part, StepPlan({}, joiners))
        except Exception as e:  # noqa: BLE001
            if len(joiners) > 1:
                for r in joiners:
                    self.admit(batch, [r])
                return
            joiners[0].done(backend_error(e))
            return
        self.retire(part)
        self.kv.merge(batch, part)

    def retire(self, batch: Batch) -> None:
        """Deliver finished rows (parking those with a route, their KV kept for the route's next
        turn), drop rows whose caller gave up, trim padding no row needs."""
        eng = self.engine
        keep = []
        park = eng.reuse_prefix and eng.park_s > 0
        for i, r in enumerate(batch.rows):
            if r.parked is not None:
                keep.append(i)
            elif r.finished:
                if eng.deliver(r, park):
                    keep.append(i)
            elif not r.gave_up():
                keep.append(i)
        self.kv.keep(batch, keep)
        eng.iteration_done()
