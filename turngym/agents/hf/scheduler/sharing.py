"""Prefix sharing for the slots engine's scheduler: a forked route's first request starts from
a copy of its donor's slot row (``share_prefix``, a tree rollout's branch) instead of a full prefill.

* **Donor with a row** (parked, or running, KV of the current weights): when the scheduler places the
  fork's first request in a free slot, the donor's first columns (their common prefix, at most the
  prompt less one token) are copied into it, and the prefill feeds only the rest.
* **Donor joining in the same iteration** (a tree branching at its first turn: the donor's and the
  forks' first requests arrive together, so the donor has no row yet): the donor is prefilled
  first, then its fresh row is copied and the forks are prefilled in a second pass.
* **Copies run on the device**, one ``index_copy_`` per layer for keys and values over every copy of
  the iteration, into the static cache buffers the CUDA graphs read (the same storage). All donors
  are read before any slot is written, so a slot that is a donor of one fork and the destination of
  another (an evicted parked row) gives its own old KV.
* **Never wrong KV**: no donor row (released, evicted, expired, stale weights or epoch), a donor whose
  prefill failed, or a prompt that does not extend the donor's first token, is a full prefill.
  ``release``, ``update_weights`` and ``reset_prefix_cache`` forget the forks that have not started.

Counted in the engine's stats: ``shared_rows`` (forks that started from a copy) and, through the
forks' ``reuse``, ``reused_tokens``.
"""

from __future__ import annotations

from turngym.agents.hf.kv.slots import Copy, SlotBatch, SlotKV
from turngym.agents.hf.parts import Engine
from turngym.agents.hf.request import Request, common_prefix


class SlotSharing:
    """``share_prefix`` for the slots scheduler: ``engine``'s donors (fork route -> donor route),
    rows copied on ``kv`` (see the module doc)."""

    def __init__(self, engine: Engine, kv: SlotKV):
        self.engine, self.kv = engine, kv

    def forget(self, route: str | None = None) -> None:
        """Forks that have not started forget their donor: every fork (``route`` None: the donors'
        KV came from old weights or an old epoch), or the forks of ``route`` (released)."""
        donors = self.engine.donors
        if route is None:
            donors.clear()
            return
        for child, donor in list(donors.items()):
            if donor == route:
                donors.pop(child, None)

    def donor_rows(self, batch: SlotBatch) -> dict[str, tuple[int, list[int]]]:
        """Route -> (slot, the ids whose KV the slot holds) of every row a fork may copy: parked or
        running, its KV from the current weights (stale parked rows are already freed). Taken before
        the iteration's joiners change any slot. Empty when no fork waits for its first request."""
        eng = self.engine
        if not (eng.donors and eng.reuse_prefix):
            return {}
        wanted = set(eng.donors.values())
        held = {}
        for s, r in enumerate(batch.slots):
            if r is not None and r.route in wanted and r.versions and r.versions[-1] == eng.weights_version:
                held[r.route] = (s, r.cached_ids[: batch.lengths[s]])
        return held

    def share_row(
        self,
        donors: dict[str, tuple[int, list[int]]],
        r: Request,
        s: int,
        copies: list[Copy],
        joining: dict[int, str],
    ) -> int:
        """How many leading prompt tokens of the fresh request ``r`` (placed in slot ``s``) come from
        a copy of its donor's row (the copy is added to ``copies``): their common prefix, leaving at
        least one token to feed; 0 (a full prefill, or ``s`` added to ``joining`` when the donor has
        no row yet: it may be joining now) without a donor row, or when the prompt does not extend
        the donor's first token."""
        src = self.engine.donors.pop(r.route, None) if r.route is not None else None
        if src is None or not self.engine.reuse_prefix:
            return 0
        if src not in donors:
            joining[s] = src
            return 0
        slot, held = donors[src]
        reuse = min(common_prefix(held, r.prompt_ids), len(r.prompt_ids) - 1)
        if reuse <= 0:
            return 0
        if slot != s:  # the donor's own evicted slot already holds the prefix
            copies.append((slot, s, reuse))
        self.engine.stats["shared_rows"] += 1
        return reuse

    def after_donors(self, placed: list[tuple[int, Request]], joining: dict[int, str]) -> dict[int, Request]:
        """Fork slot -> donor request, for the forks in ``joining`` whose donor is another request
        placed in this iteration (not itself such a fork): prefilled after it, from a copy."""
        joined = {r.route: r for s, r in placed if r.route is not None and s not in joining}
        return {s: joined[src] for s, src in joining.items() if src in joined}

    def share_joined(self, batch: SlotBatch, after: dict[int, Request]) -> None:
        """The forks of donors prefilled just now (``after_donors``) start from copies of those
        rows; a donor whose prefill failed (its slot freed) leaves its forks to a full prefill."""
        copies: list[Copy] = []
        for s, donor in after.items():
            d = next((i for i, x in enumerate(batch.slots) if x is donor), None)
            r = batch.slots[s]
            if d is None or r is None or not donor.tokens:
                continue
            reuse = min(
                common_prefix(donor.cached_ids[: batch.lengths[d]], r.prompt_ids), len(r.prompt_ids) - 1
            )
            if reuse > 0:
                copies.append((d, s, reuse))
                r.reuse = reuse
                self.engine.stats["shared_rows"] += 1
        if copies:
            self.kv.copy_rows(copies)
