"""Pairwise judges for ``travel-open`` (and ``travel-planner``) in the ``arena`` credit method.

``travel-open`` has no checkable answer: its outcome reward is the neutral 0.0 and its rewards come
from comparing trajectories of the same task pairwise. This module is light (no pandas) so a trainer
can import it directly.

Programmatic judge (no LLM needed)::

    from turngym.trainer.judges import ProgrammaticJudge
    from turngym.envs.travel.judge import pairwise_scores, score_trajectory
    judge = ProgrammaticJudge(pairwise_scores)          # or ProgrammaticJudge.from_scorer(score_trajectory)

``pairwise_scores(a, b) -> (score_a, score_b)`` scores one order on the rubric's 0–10 scale as
``0.6 * process + 0.4 * answer``, from what the env recorded on the submit turn
(``info["judge_features"]``), or from the ``cs.*`` / ``hard.*`` / ``verifier`` reward components of
trajectories without those features.

LLM judge: ``RUBRIC_PROMPT`` (ArenaRL's travel rubric), ``judge_messages(a, b)`` and
``parse_judge_reply(text)`` (turngym's one judge-reply parser with ``TRAVEL_RUBRIC``; a bad reply is a
``JudgeParseError``); ``llm_pairwise(complete)`` bundles them with retries for ``ProgrammaticJudge``.

Published judge: ``JUDGE`` (an :class:`~turngym.core.judging.EnvJudge`) is registered with
``travel-planner`` and ``travel-open``; the ``arena`` credit method finds it through
:func:`turngym.core.judging.env_judge`. docs/envs/travel.md describes the rubric.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from turngym.core.judging import EnvJudge, Rubric
from turngym.core.judging import parse_judge_reply as _parse_reply
from turngym.core.types import Message, Trajectory

if TYPE_CHECKING:
    from turngym.envs.travel.evaluate import PlanEvaluation
    from turngym.envs.travel.models import DayPlan, Query
    from turngym.envs.travel.verifier import GroundingReport

PROCESS_WEIGHT = 0.6
ANSWER_WEIGHT = 0.4
PROCESS_DIMENSIONS = ("breadth", "relevance", "detail")
ANSWER_DIMENSIONS = ("relevance", "feasibility", "details", "clarity")
RUBRIC = {
    "process": (
        "breadth: covers transport, stays, food and sights from several angles without redundant calls",
        "relevance: every step serves the user's core needs",
        "detail: facts, times, prices and rules gathered are sufficient and accurate",
    ),
    "answer": (
        "relevance: answers every sub-request and preference",
        "feasibility: the itinerary is consistent and workable, with no conflicts",
        "details: schedule, prices, travel times and tips are rich and useful",
        "clarity: well structured and easy to read",
    ),
    "process_weight": PROCESS_WEIGHT,
    "answer_weight": ANSWER_WEIGHT,
}
TRAVEL_RUBRIC = Rubric(**RUBRIC, process_keys=PROCESS_DIMENSIONS, answer_keys=ANSWER_DIMENSIONS)
_TRANSPORT_TOOLS = ("search_flights", "distance")
_CATEGORY_TOOLS = (
    _TRANSPORT_TOOLS,
    ("search_accommodations",),
    ("search_restaurants",),
    ("search_attractions",),
)

RUBRIC_PROMPT = """You are an expert travel-industry reviewer with a rigorous evaluation method. For one user
query, score the reasoning path (PATH) and the final answer (ANSWER) of two LLM agents, A and B, on each
dimension, then give combined scores and a winner. Follow the dimensions, rules and output format exactly.

Input format:
<USER_QUERY>the user's request</USER_QUERY>
<PATH_A>agent A's tool calls</PATH_A> <PATH_B>agent B's tool calls</PATH_B>
<ANSWER_A>agent A's final plan</ANSWER_A> <ANSWER_B>agent B's final plan</ANSWER_B>

Path evaluation (judge only the tool calls actually made):
1. Breadth: covers the problem from several angles (dates, places, transport, prices, rules) without redundant or repeated steps.
2. Relevance: how well each step matches the user's core needs.
3. Detail: whether the facts, figures, times, costs and rules gathered are sufficient, accurate and useful.
Each 0-10 (0 = missing, 10 = outstanding); Overall_P = mean of the three, rounded to an integer.

Answer evaluation (use the knowledge in the corresponding path):
1. Relevance: responds to every sub-request and constraint; order and setting fit.
2. Feasibility: the arrangement is self-consistent and practical, with no obvious conflicts.
3. Details: schedule, prices, travel times and tips are rich and practical.
4. Clarity: clear structure, friendly layout, readable.
Each 0-10; Overall_A = mean of the four, rounded to an integer.

combined_scores = 0.6 * Overall_P + 0.4 * Overall_A, rounded to one decimal. Equal combined scores mean "Tie".

Tools: search_flights(origin, destination, date), distance(origin, destination, mode), search_accommodations(city),
search_restaurants(city), search_attractions(city), search_cities(state), notebook_write(text), submit_plan(plan).

Reply with this JSON only:
{"analysis": {"path_A": "...", "path_B": "...", "answer_A": "...", "answer_B": "..."},
 "path_scores": {"Agent_A": {"breadth": 0, "relevance": 0, "detail": 0, "overall_p": 0},
                 "Agent_B": {"breadth": 0, "relevance": 0, "detail": 0, "overall_p": 0}},
 "answer_scores": {"Agent_A": {"relevance": 0, "feasibility": 0, "details": 0, "clarity": 0, "overall_a": 0},
                   "Agent_B": {"relevance": 0, "feasibility": 0, "details": 0, "clarity": 0, "overall_a": 0}},
 "combined_scores": {"Agent_A": 0, "Agent_B": 0},
 "winner": "Agent_A | Agent_B | Tie"}
Think about each dimension independently before scoring; base every comment only on the given text."""


def combine(process: Sequence[float], answer: Sequence[float]) -> float:
    """``0.6 * mean(process) + 0.4 * mean(answer)`` (each on 0–10)."""
    return TRAVEL_RUBRIC.combine(process, answer)


# ------------------------------------------------------------ features
def features_from_episode(
    query: Query | None,
    evaluation: PlanEvaluation | None,
    grounding: GroundingReport | None,
    call_history: Sequence[str],
    plan: Sequence[DayPlan] | None,
    places: Sequence[str] = (),
) -> dict[str, float]:
    """Rubric dimensions (0–10) of one episode, from the env's own records.

    ``places``: the names a relevant search mentions (origin, destination, its cities).
    """
    calls = [c.split(":", 1) for c in call_history]
    searches = [(n, a) for n, a in calls if n not in ("submit_plan", "notebook_write")]
    names = {n for n, _ in searches}
    breadth = sum(any(t in names for t in cat) for cat in _CATEGORY_TOOLS) / len(_CATEGORY_TOOLS)
    repeats = len(searches) - len(set(map(tuple, searches)))
    breadth = max(0.0, breadth - 0.05 * repeats)
    places = list(places) or ([query.org, query.dest] if query is not None else [])
    relevance = sum(any(p in a for p in places) for _, a in searches) / len(searches) if searches else 0.0
    detail = grounding.rate if grounding is not None else 0.0
    out = {
        "process.breadth": 10 * breadth,
        "process.relevance": 10 * relevance,
        "process.detail": 10 * detail,
    }
    if evaluation is None or not evaluation.delivered:
        out.update({f"answer.{d}": 0.0 for d in ANSWER_DIMENSIONS})
    else:
        hard = [ok for ok, _ in (evaluation.hard or {}).values() if ok is not None]
        cs = [bool(ok) for ok, _ in evaluation.commonsense.values()]
        filled = _filled_fraction(plan or [])
        days_ok = query is not None and plan is not None and len(plan) == query.days
        out["answer.relevance"] = 10 * (sum(hard) / len(hard) if hard else 0.0)
        out["answer.feasibility"] = 10 * sum(cs) / len(cs)
        out["answer.details"] = 10 * filled
        out["answer.clarity"] = 10.0 if days_ok else 5.0
    out["combined"] = _combined(out)
    return out


def _filled_fraction(plan: Sequence[DayPlan]) -> float:
    fields = ("current_city", "transportation", "breakfast", "attraction", "lunch", "dinner", "accommodation")
    total = len(plan) * len(fields)
    filled = sum(1 for d in plan for f in fields if getattr(d, f) not in (None, ""))
    return filled / total if total else 0.0


def _combined(feats: dict[str, float]) -> float:
    return combine(
        [feats.get(f"process.{d}", 0.0) for d in PROCESS_DIMENSIONS],
        [feats.get(f"answer.{d}", 0.0) for d in ANSWER_DIMENSIONS],
    )


def features_from_trajectory(traj: Trajectory | dict[str, Any]) -> dict[str, float]:
    """The judge features a trajectory carries (``judge_features`` of its last turns), or ones
    rebuilt from its reward components when the env recorded none."""
    t = traj if isinstance(traj, Trajectory) else Trajectory.model_validate(traj)
    for turn in reversed(t.turns):
        feats = turn.info.get("judge_features")
        if isinstance(feats, dict):
            return {k: float(v) for k, v in feats.items()}
    comps: dict[str, float] = {}
    tool_ok: list[float] = []
    for turn in t.turns:
        comps.update(turn.reward_components)
        if "tool_ok" in turn.reward_components:
            tool_ok.append(turn.reward_components["tool_ok"])
    cs = [v for k, v in comps.items() if k.startswith("cs.")]
    hard = [v for k, v in comps.items() if k.startswith("hard.")]
    feats = {
        "process.breadth": 10 * min(1.0, len(tool_ok) / 6),
        "process.relevance": 10 * (sum(tool_ok) / len(tool_ok) if tool_ok else 0.0),
        "process.detail": 10 * comps.get("verifier", 0.0),
        "answer.relevance": 10 * (sum(hard) / len(hard) if hard else 0.0),
        "answer.feasibility": 10 * (sum(cs) / len(cs) if cs else 0.0),
        "answer.details": 10 * comps.get("cs.complete_information", 0.0),
        "answer.clarity": 10.0 if cs else 0.0,
    }
    feats["combined"] = _combined(feats)
    return feats


def score_trajectory(traj: Trajectory | dict[str, Any]) -> float:
    """The programmatic rubric score of one trajectory, 0–10."""
    return features_from_trajectory(traj)["combined"]


def pairwise_scores(a: Trajectory | dict[str, Any], b: Trajectory | dict[str, Any]) -> tuple[float, float]:
    """Programmatic pairwise judge, one order: ``(score_a, score_b)`` on 0–10."""
    return score_trajectory(a), score_trajectory(b)


# ------------------------------------------------------------ LLM judge
def _calls(message: Message) -> list[dict[str, Any]]:
    if message.tool_calls:
        return [{"name": c.name, "arguments": c.arguments} for c in message.tool_calls]
    from turngym.tools.parsers import get_parser

    return [
        {"name": c.call.name, "arguments": c.call.arguments}
        for c in get_parser("hermes").parse(message).calls
        if c.ok and c.call
    ]


def render_path_and_answer(traj: Trajectory | dict[str, Any], max_chars: int = 8000) -> tuple[str, str]:
    """(the agent's tool calls step by step, its submitted plan as text or "(no answer)")."""
    t = traj if isinstance(traj, Trajectory) else Trajectory.model_validate(traj)
    steps, answer = [], "(no answer)"
    for i, turn in enumerate(t.turns, 1):
        calls = _calls(turn.action)
        for c in calls:
            if c["name"] == "submit_plan":
                answer = _plan_text(c["arguments"].get("plan"))
        rest = [c for c in calls if c["name"] != "submit_plan"]
        if rest:
            steps.append(json.dumps({"step": i, "tool_calls": rest}, ensure_ascii=False))
    path = "\n".join(steps) or "(no tool calls)"
    return path[:max_chars], answer[:max_chars]


def _plan_text(plan: Any) -> str:
    if isinstance(plan, str):
        return plan
    if not isinstance(plan, list):
        return json.dumps(plan, ensure_ascii=False)
    lines = []
    for day in plan:
        if isinstance(day, dict):
            lines.append(
                f"Day {day.get('days', '?')}: "
                + "; ".join(f"{k}: {v}" for k, v in day.items() if k != "days")
            )
    return "\n".join(lines)


def judge_messages(a: Trajectory | dict[str, Any], b: Trajectory | dict[str, Any]) -> list[dict[str, str]]:
    """Chat messages asking an LLM to compare ``a`` (Agent_A) with ``b`` (Agent_B)."""
    ta = a if isinstance(a, Trajectory) else Trajectory.model_validate(a)
    query = "\n".join(m.content for m in ta.prompt if m.role == "user")
    path_a, ans_a = render_path_and_answer(a)
    path_b, ans_b = render_path_and_answer(b)
    user = (
        f"<USER_QUERY>\n{query}\n</USER_QUERY>\n\n<PATH_A>\n{path_a}\n</PATH_A>\n\n<PATH_B>\n{path_b}\n</PATH_B>\n\n"
        f"<ANSWER_A>\n{ans_a}\n</ANSWER_A>\n\n<ANSWER_B>\n{ans_b}\n</ANSWER_B>"
    )
    return [{"role": "system", "content": RUBRIC_PROMPT}, {"role": "user", "content": user}]


def parse_judge_reply(text: str) -> tuple[float, float]:
    """``(score_a, score_b)`` from the judge's JSON: recomputed from the dimension scores with
    the 0.6/0.4 weights; falls back to ``combined_scores`` when dimensions are missing. Raises
    ``JudgeParseError`` (a ``ValueError``) otherwise (see :mod:`turngym.core.judging`)."""
    return _parse_reply(text, TRAVEL_RUBRIC)


def llm_pairwise(
    complete: Callable[[list[dict[str, str]]], str], retries: int = 2, tie: float = 5.0
) -> Callable[[Trajectory | dict[str, Any], Trajectory | dict[str, Any]], tuple[float, float]]:
    """A one-order pairwise judge from a chat completion function ``complete(messages) -> text``.

    A reply that does not parse is asked again up to ``retries`` times, then counts as a tie
    (``tie`` for both). Wrap it in the trainer's ``ProgrammaticJudge`` to judge both orders.
    """

    def judge(a: Trajectory | dict[str, Any], b: Trajectory | dict[str, Any]) -> tuple[float, float]:
        messages = judge_messages(a, b)
        for _ in range(retries + 1):
            try:
                return parse_judge_reply(complete(messages))
            except ValueError:
                continue
        return tie, tie

    return judge


JUDGE = EnvJudge(
    rubric=TRAVEL_RUBRIC, messages=judge_messages, pairwise=pairwise_scores, pointwise=score_trajectory
)
