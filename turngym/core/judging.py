"""What an env publishes about how to judge its trajectories pairwise: its rubric, its judge
prompt and programmatic scorer, and the one parser of judge replies.

An env family that has no checkable answer (``travel-open``) or wants a better comparison than its
outcome reward publishes an :class:`EnvJudge` and names it when registering:
``register("travel-open-v0", ..., judge="turngym.envs.travel.judge:JUDGE")``.
The trainer's ``arena`` credit method asks :func:`env_judge` for it by env id, so the trainer never
imports an env family and the env never imports the trainer; both meet here.

:func:`parse_judge_reply` reads every reply shape a turngym judge prompt asks for:

* ``{"A": {"process": [..], "answer": [..]}, "B": {...}}`` (the trainer's generic prompt; a side
  may also be ``"Agent_A"``/``"Agent_B"``, a part may be one number, a list of up to as many scores
  as the rubric has dimensions (their mean counts), or an object keyed by the dimensions' keys);
* ``{"path_scores": {"Agent_A": {dim: score}}, "answer_scores": {...}}`` (ArenaRL's shape, the
  travel rubric's prompt);
* fallback: ``{"combined_scores": {"Agent_A": x, "Agent_B": y}}``, used for a side only when its
  dimension scores are absent or incomplete.

Every score must be a number (or a numeric string) in ``[0, 10]``; booleans, NaN, out-of-range
values, a missing side or a reply with no JSON object raise :class:`JudgeParseError` (a
``ValueError``) naming the problem. The parser never guesses a score: the caller retries, then
counts a tie.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from turngym.core.types import Trajectory

PairFn = Callable[[Trajectory, Trajectory], tuple[float, float]]
SIDES = (("A", "Agent_A"), ("B", "Agent_B"))


class JudgeParseError(ValueError):
    """A judge reply that holds no valid scores; the message says what is wrong."""


@dataclass(frozen=True)
class Rubric:
    """Dimensions scored 0-10, averaged per part (process, answer), combined with the part weights.

    A dimension's text may start with its key (``"breadth: covers ..."`` has the key ``breadth``);
    ``process_keys``/``answer_keys`` name the keys explicitly (otherwise: the text before the first
    colon, or the whole text). Replies that score dimensions by name use these keys.
    """

    process: tuple[str, ...]
    answer: tuple[str, ...]
    process_weight: float
    answer_weight: float
    process_keys: tuple[str, ...] = ()
    answer_keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.process or not self.answer:
            raise ValueError("a rubric needs at least one process and one answer dimension")
        for part, keys in (("process", self.process_keys), ("answer", self.answer_keys)):
            if keys and len(keys) != len(getattr(self, part)):
                raise ValueError(f"{part}_keys must name every {part} dimension")

    def keys(self, part: str) -> tuple[str, ...]:
        """The dimension keys of ``part`` (``"process"`` or ``"answer"``)."""
        explicit = self.process_keys if part == "process" else self.answer_keys
        if explicit:
            return explicit
        return tuple(d.split(":", 1)[0].strip() for d in getattr(self, part))

    def combine(self, process: Sequence[float], answer: Sequence[float]) -> float:
        """``process_weight * mean(process) + answer_weight * mean(answer)`` (an empty part counts 0)."""
        p = sum(process) / len(process) if process else 0.0
        a = sum(answer) / len(answer) if answer else 0.0
        return self.process_weight * p + self.answer_weight * a


# ----------------------------------------------------------------------------- parsing
def _first_json_object(text: str) -> dict[str, Any]:
    """The first JSON object in ``text`` (prose and code fences around it are ignored)."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    error = "no JSON object in the judge reply"
    while start != -1:
        try:
            data, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError as e:
            error = f"invalid JSON in the judge reply: {e}"
        else:
            if isinstance(data, dict):
                return data
        start = text.find("{", start + 1)
    raise JudgeParseError(error)


def _score(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise JudgeParseError(f"{where} is not a number: {value!r}")
    try:
        x = float(value)
    except ValueError as e:
        raise JudgeParseError(f"{where} is not a number: {value!r}") from e
    if math.isnan(x) or not 0 <= x <= 10:
        raise JudgeParseError(f"{where} must lie in [0, 10], got {value!r}")
    return x


def _part_scores(vals: Any, keys: tuple[str, ...], where: str) -> list[float] | None:
    """Scores of one part: a number, a list of up to ``len(keys)`` numbers, or an object holding
    every key (extra keys such as ``overall_p`` are ignored). None when the part is absent or an
    object lacks a key (the caller may fall back to combined scores)."""
    if vals is None:
        return None
    if isinstance(vals, Mapping):
        if not all(k in vals for k in keys):
            return None
        return [_score(vals[k], f"{where}.{k}") for k in keys]
    if isinstance(vals, (int, float, str)) and not isinstance(vals, bool):
        vals = [vals]
    if not isinstance(vals, list) or not vals or len(vals) > len(keys):
        raise JudgeParseError(f"{where} must be a list of 1 to {len(keys)} scores, got {vals!r}")
    return [_score(v, f"{where}[{i}]") for i, v in enumerate(vals)]


def _side(data: Mapping[str, Any], names: tuple[str, str], rubric: Rubric) -> float:
    short, agent = names
    block = data.get(short, data.get(agent))
    if isinstance(block, Mapping):  # {"A": {"process": ..., "answer": ...}}
        process = _part_scores(block.get("process"), rubric.keys("process"), f"{short}.process")
        answer = _part_scores(block.get("answer"), rubric.keys("answer"), f"{short}.answer")
    else:  # ArenaRL: {"path_scores": {"Agent_A": {...}}, "answer_scores": {...}}
        path, ans = data.get("path_scores"), data.get("answer_scores")
        process = answer = None
        if isinstance(path, Mapping) and isinstance(ans, Mapping):
            p, a = path.get(agent, path.get(short)), ans.get(agent, ans.get(short))
            if isinstance(p, Mapping) and isinstance(a, Mapping):
                process = _part_scores(p, rubric.keys("process"), f"path_scores.{agent}")
                answer = _part_scores(a, rubric.keys("answer"), f"answer_scores.{agent}")
    if process is not None and answer is not None:
        return rubric.combine(process, answer)
    combined = data.get("combined_scores")
    if isinstance(combined, Mapping) and (agent in combined or short in combined):
        return _score(combined.get(agent, combined.get(short)), f"combined_scores.{agent}")
    raise JudgeParseError(f"the judge reply has no scores for {agent}")


def parse_judge_reply(text: str, rubric: Rubric) -> tuple[float, float]:
    """``(score_a, score_b)`` from a judge's reply (see the module docstring for the shapes):
    each side's dimension scores combined with ``rubric``'s weights, or its ``combined_scores``
    when the dimensions are absent. Raises :class:`JudgeParseError` on anything else."""
    data = _first_json_object(text if isinstance(text, str) else "")
    a, b = (_side(data, names, rubric) for names in SIDES)
    return a, b


# ----------------------------------------------------------------------------- publication
Messages = list[dict[str, str]]


@dataclass(frozen=True)
class EnvJudge:
    """An env's published judge.

    ``rubric``: the dimensions and weights an LLM judge scores; ``messages(a, b)``: the env's own
    judge prompt as chat messages (None: the trainer's generic prompt over ``rubric``);
    ``pairwise(a, b) -> (score_a, score_b)``: a programmatic one-order judge (None: none);
    ``pointwise(a) -> score``: the same rubric on one trajectory (the ``pointwise`` credit method's
    default scorer; None: none).
    """

    rubric: Rubric
    messages: Callable[[Trajectory, Trajectory], Messages] | None = None
    pairwise: PairFn | None = None
    pointwise: Callable[[Trajectory], float] | None = None

    def parse(self, text: str) -> tuple[float, float]:
        """``parse_judge_reply(text, self.rubric)``."""
        return parse_judge_reply(text, self.rubric)


def env_judge(env: str) -> EnvJudge | None:
    """The judge the env ``env`` publishes (an env id, or a family name whose envs publish one),
    or None when it publishes none or the registry does not know it."""
    from turngym.core.registry import UnknownEnvError, registry

    try:
        spec = registry.spec(env)
    except (UnknownEnvError, ValueError):
        specs = [s for s in registry.latest() if s.family == env and s.judge]
        if not specs:
            return None
        spec = specs[0]
    return spec.load_judge()
