"""The plain step plans a scheduler hands its runner: what one forward pass (or decode block) feeds.

Plans hold requests, slots and sizes, never tensors or model state, so the scheduler's decisions can
be read, logged and tested apart from the forward pass that carries them out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from turngym.agents.hf.request import Request

MIN_COLUMNS = 64  # the smallest context bucket of the slots engine
MIN_FEED = 16  # the smallest feed bucket of a prefill graph


def bucket(n: int, smallest: int, cap: int) -> int:
    """The smallest ``smallest * 2^i`` at or above ``n``, at most ``cap``."""
    b = smallest
    while b < n:
        b *= 2
    return min(b, cap)


@dataclass
class StepPlan:
    """One pass of the continuous engine over its padded batch: rows resuming a parked (or a
    fork's copied) row feed their prompt after the reused prefix (``resumes``: row index ->
    request), ``joiners`` become new rows fed their whole prompt, every other live row feeds its
    pending token. Empty ``resumes`` and ``joiners``: a plain decode step."""

    resumes: dict[int, Request] = field(default_factory=dict)
    joiners: list[Request] = field(default_factory=list)


@dataclass
class PrefillPlan:
    """One prefill pass of the slots engine: each ``(slot, request)`` feeds its prompt after its
    reused prefix into its slot's columns."""

    rows: list[tuple[int, Request]]


@dataclass
class DecodePlan:
    """One decode block of the slots engine: ``steps`` steps of the ``live`` slots over slots
    ``0..width-1`` and the first ``columns`` cache columns; ``index[s]``: the token index slot ``s``
    samples first (its draw); ``filtered``: whether a row samples with top-k/top-p."""

    live: list[int]
    width: int
    columns: int
    steps: int
    filtered: bool
    index: list[int]
