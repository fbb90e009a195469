"""Prefix sharing for the slots engine (``HFSlotBackend``): a forked route's first request starts from
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

Counted in ``HFBackend``'s stats: ``shared_rows`` (forks that started from a copy) and, through the
forks' ``reuse``, ``reused_tokens``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from turngym.agents.hf import _common_prefix, _Request

if TYPE_CHECKING:
    from turngym.agents.hf_slots import _SlotBatch

Copy = tuple[int, int, int]  # (donor slot, new slot, columns)


class SlotSharing:
    """``share_prefix`` for ``HFSlotBackend`` (mixed in before ``HFBackend``, whose ``_donors``,
    ``stats``, ``weights_version`` and ``reuse_prefix`` it uses; see the module doc)."""

    _donors: dict[str, str]
    stats: dict[str, Any]
    weights_version: int
    reuse_prefix: bool
    device: Any

    def update_weights(self, state_dict: dict[str, Any], strict: bool = True) -> None:
        """``HFBackend.update_weights``; forks waiting for their first request forget their donors
        (the donors' KV came from the old weights)."""
        super().update_weights(state_dict, strict)  # type: ignore[misc]
        self._donors.clear()

    def reset_prefix_cache(self) -> None:
        super().reset_prefix_cache()  # type: ignore[misc]
        self._donors.clear()

    def release(self, route: str) -> None:
        """``HFBackend.release``; forks of ``route`` that have not started yet will prefill in full."""
        super().release(route)  # type: ignore[misc]
        for child, donor in list(self._donors.items()):
            if donor == route:
                self._donors.pop(child, None)

    def _donor_rows(self, batch: _SlotBatch) -> dict[str, tuple[int, list[int]]]:
        """Route -> (slot, the ids whose KV the slot holds) of every row a fork may copy: parked or
        running, its KV from the current weights (stale parked rows are already freed). Taken before
        the iteration's joiners change any slot. Empty when no fork waits for its first request."""
        if not (self._donors and self.reuse_prefix):
            return {}
        wanted = set(self._donors.values())
        held = {}
        for s, r in enumerate(batch.slots):
            if r is not None and r.route in wanted and r.versions and r.versions[-1] == self.weights_version:
                held[r.route] = (s, r.cached_ids[: batch.lengths[s]])
        return held

    def _share_row(
        self,
        donors: dict[str, tuple[int, list[int]]],
        r: _Request,
        s: int,
        copies: list[Copy],
        joining: dict[int, str],
    ) -> int:
        """How many leading prompt tokens of the fresh request ``r`` (placed in slot ``s``) come from
        a copy of its donor's row (the copy is added to ``copies``): their common prefix, leaving at
        least one token to feed; 0 (a full prefill, or ``s`` added to ``joining`` when the donor has
        no row yet: it may be joining now) without a donor row, or when the prompt does not extend
        the donor's first token."""
        src = self._donors.pop(r.route, None) if r.route is not None else None
        if src is None or not self.reuse_prefix:
            return 0
        if src not in donors:
            joining[s] = src
            return 0
        slot, held = donors[src]
        reuse = min(_common_prefix(held, r.prompt_ids), len(r.prompt_ids) - 1)
        if reuse <= 0:
            return 0
        if slot != s:  # the donor's own evicted slot already holds the prefix
            copies.append((slot, s, reuse))
        self.stats["shared_rows"] += 1
        return reuse

    def _after_donors(
        self, placed: list[tuple[int, _Request]], joining: dict[int, str]
    ) -> dict[int, _Request]:
        """Fork slot -> donor request, for the forks in ``joining`` whose donor is another request
        placed in this iteration (not itself such a fork): prefilled after it, from a copy."""
        joined = {r.route: r for s, r in placed if r.route is not None and s not in joining}
        return {s: joined[src] for s, src in joining.items() if src in joined}

    def _share_joined(self, batch: _SlotBatch, after: dict[int, _Request]) -> None:
        """The forks of donors prefilled just now (``_after_donors``) start from copies of those
        rows; a donor whose prefill failed (its slot freed) leaves its forks to a full prefill."""
        copies: list[Copy] = []
        for s, donor in after.items():
            d = next((i for i, x in enumerate(batch.slots) if x is donor), None)
            r = batch.slots[s]
            if d is None or r is None or not donor.tokens:
                continue
            reuse = min(
                _common_prefix(donor.cached_ids[: batch.lengths[d]], r.prompt_ids), len(r.prompt_ids) - 1
            )
            if reuse > 0:
                copies.append((d, s, reuse))
                r.reuse = reuse
                self.stats["shared_rows"] += 1
        if copies:
            self._copy_rows(copies)

    def _copy_rows(self, copies: list[Copy]) -> None:
        """Copy the first ``columns`` cache columns of each donor slot into its new slot, every layer,
        on the device and in place (the captured graphs keep reading the same storage). All donors
        are read before any slot is written."""
        import torch

        cache = self._buffers()  # type: ignore[attr-defined]
        n = max(c for _, _, c in copies)  # a shorter prefix copies a few extra columns, never read
        src = torch.tensor([a for a, _, _ in copies], device=self.device)
        dst = torch.tensor([b for _, b, _ in copies], device=self.device)
        with torch.inference_mode():
            for t in (*cache.keys, *cache.values):
                t[:, :, :n].index_copy_(0, dst, t[src, :, :n])
