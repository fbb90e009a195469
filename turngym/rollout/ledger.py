"""The rollout time ledger: where each trajectory's seconds went.

Every turn records ``Turn.timing`` (seconds): ``generate`` (the agent's action, as the caller waited
for it), ``env_step`` (the env's step: tool calls, sandbox commands, browser actions) and
``observe`` (appending the observation to the token sequence). A backend that reports its side
(the HF backend does, in ``Generation.meta["timing"]``) adds ``generate/queued`` (waiting for a
row), ``generate/prefill`` (the pass that read the prompt) and ``generate/decode`` (sampling the
tokens) — parts of ``generate``, not beside it (the vLLM backend reports none yet: its requests'
retries are counted in ``VLLMBackend.stats``).
Each trajectory records in ``metrics``: ``time/env_start`` (building the env: a container, a
browser), ``time/reset`` and ``time/close``.

:func:`ledger_totals` sums a set of trajectories per phase; :func:`ledger_metrics` turns the sums
into the trainer's ``rollout/time/<phase>`` (seconds summed over trajectories, which overlap in wall
time), ``rollout/time_share/<phase>`` (each top-level phase's share of the trajectories' summed
time) and ``rollout/trajectories_per_hour``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from turngym.core.types import Trajectory

#: Per-turn phases that add up (with the per-trajectory ones) to a trajectory's time.
TURN_PHASES = ("generate", "env_step", "observe")
#: Per-trajectory phases, kept in ``Trajectory.metrics`` as ``time/<phase>``.
TRAJECTORY_PHASES = ("env_start", "reset", "close")
#: Top-level phases: their shares of the summed time add up to 1.
PHASES = ("env_start", "reset", *TURN_PHASES, "close")
#: Parts of ``generate`` a backend may report (``Generation.meta["timing"]``).
GENERATE_PARTS = ("queued", "prefill", "decode")


def ledger_totals(trajs: Iterable[Trajectory]) -> dict[str, float]:
    """Seconds per phase (and backend parts as ``generate/<part>``), summed over trajectories."""
    total: Counter[str] = Counter()
    for t in trajs:
        for phase in TRAJECTORY_PHASES:
            total[phase] += float(t.metrics.get(f"time/{phase}", 0.0))
        for turn in t.turns:
            for phase, seconds in turn.timing.items():
                total[phase] += float(seconds)
    return dict(total)


def ledger_metrics(
    trajs: list[Trajectory], wall_s: float | None = None, prefix: str = "rollout/"
) -> dict[str, float]:
    """``{prefix}time/<phase>``, ``{prefix}time_share/<phase>`` and, given the rollout's wall time,
    ``{prefix}trajectories_per_hour``."""
    totals = ledger_totals(trajs)
    out = {f"{prefix}time/{k}": v for k, v in sorted(totals.items())}
    top = sum(totals.get(p, 0.0) for p in PHASES)
    if top > 0:
        out.update({f"{prefix}time_share/{p}": totals.get(p, 0.0) / top for p in PHASES})
    if wall_s:
        out[f"{prefix}trajectories_per_hour"] = len(trajs) * 3600.0 / wall_s
    return out
