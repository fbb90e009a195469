"""The ``mcp`` family's published judge (``turngym.core.judging``): a rubric for an LLM judge and a
programmatic pairwise scorer, used by the trainer's ``arena`` credit method.

The pairwise scorer needs no model: process = 10 x the share of the trajectory's tool calls that were
valid (no unknown tool, bad arguments or tool error); answer = 10 x the best token F1 of the submitted
answer against the reference answers (0 without an answer). A masked trajectory scores 0.
"""

from __future__ import annotations

from turngym.core.env import INVALID_KINDS
from turngym.core.judging import EnvJudge, Rubric
from turngym.core.types import Trajectory
from turngym.envs.search.metrics import best_f1

RUBRIC = Rubric(
    process=("tool_use: calls the right tools with valid arguments and no wasted calls",),
    answer=("correctness: the final answer matches the reference answer",),
    process_weight=0.3,
    answer_weight=0.7,
)


def _score(traj: Trajectory) -> float:
    if traj.masked:
        return 0.0
    results = [r for t in traj.turns for r in t.tool_results]
    valid = sum(1 for r in results if r.ok or r.error_kind not in INVALID_KINDS)
    process = 10.0 * valid / len(results) if results else 0.0
    answer = next((t.info["answer"] for t in reversed(traj.turns) if "answer" in t.info), None)
    golds = list(traj.reference.get("answers") or [])
    correct = 10.0 * best_f1(str(answer), golds) if answer is not None else 0.0
    return RUBRIC.combine([process], [correct])


def pairwise(a: Trajectory, b: Trajectory) -> tuple[float, float]:
    """``(score_a, score_b)`` in [0, 10] from the rubric's weights (see the module docstring)."""
    return _score(a), _score(b)


JUDGE = EnvJudge(rubric=RUBRIC, pairwise=pairwise)
