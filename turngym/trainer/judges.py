"""Pairwise trajectory judges for ``arena`` credit: programmatic and LLM (rubric) judges.

A judge is called as ``judge(traj_a, traj_b) -> (score_a, score_b)`` and always scores both
orders (a,b) and (b,a) and adds them, which cancels position bias. Judges count their matches,
ties and failures in ``judge.metrics``; the counters are thread-safe because tournament rounds run
their matches concurrently.

Rubrics and reply parsing have one home, :mod:`turngym.core.judging` (``Rubric``,
``JudgeParseError``, ``parse_judge_reply``; re-exported here, ``parse_scores`` is the old name of
the parser). Env-specific rubrics live with their env, which publishes them as an ``EnvJudge``
(``register(..., judge="module:attr")``); :func:`get_judge_rubric` and ``RUBRICS`` find them by env
id or family (``"travel"`` is the travel env's). Only the generic ``"research"`` rubric lives here.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from turngym.core.judging import EnvJudge, JudgeParseError, Rubric, env_judge, parse_judge_reply
from turngym.core.types import Trajectory

__all__ = [
    "PROMPT",
    "RUBRICS",
    "EnvJudge",
    "JudgeParseError",
    "LLMJudge",
    "ProgrammaticJudge",
    "Rubric",
    "backend_complete",
    "get_judge_rubric",
    "judge_win_rate",
    "openai_complete",
    "outcome_judge",
    "parse_judge_reply",
    "parse_scores",
    "render_attempt",
    "render_task",
]

PairFn = Callable[[Trajectory, Trajectory], tuple[float, float]]


@dataclass
class _Counters:
    values: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, name: str, value: float = 1.0) -> None:
        with self.lock:
            self.values[name] = self.values.get(name, 0.0) + value

    def snapshot(self) -> dict[str, float]:
        with self.lock:
            return dict(self.values)


class ProgrammaticJudge:
    """Wraps ``fn(traj_a, traj_b) -> (score_a, score_b)`` (e.g. constraint checks), both orders added."""

    def __init__(self, fn: PairFn):
        self.fn = fn
        self._counters = _Counters()

    @classmethod
    def from_scorer(cls, score: Callable[[Trajectory], float]) -> ProgrammaticJudge:
        """A judge from a per-trajectory score (e.g. the fraction of constraints met)."""
        return cls(lambda a, b: (float(score(a)), float(score(b))))

    @property
    def metrics(self) -> dict[str, float]:
        return self._counters.snapshot()

    def __call__(self, a: Trajectory, b: Trajectory) -> tuple[float, float]:
        ab = self.fn(a, b)
        ba = self.fn(b, a)
        sa, sb = float(ab[0]) + float(ba[1]), float(ab[1]) + float(ba[0])
        self._counters.add("judge/matches")
        if sa == sb:
            self._counters.add("judge/ties")
        return sa, sb


def judge_win_rate(
    trajs: list[Trajectory], baseline: list[Trajectory], judge: Callable[[Trajectory, Trajectory], tuple]
) -> dict[str, float]:
    """How often a policy's trajectories beat a baseline's on the same tasks (matched by seed), by
    ``judge(a, b) -> (score_a, score_b)`` (a judge that adds both orders, as the arena's do): a win
    is 1, a tie 0.5. A masked trajectory loses to an unmasked one (two masked: a tie, not judged);
    a judge that raises on a pair leaves the pair out of the rate and counts it in
    ``eval/judge/errors``. Returns ``eval/judge/{win_rate,ties,pairs,errors,seconds}``."""
    t0 = time.perf_counter()
    by_seed = {t.seed: t for t in baseline}
    points: list[float] = []
    ties = errors = 0
    for t in trajs:
        base = by_seed.get(t.seed)
        if base is None:
            continue
        if t.masked or base.masked:
            points.append(0.5 if t.masked and base.masked else float(base.masked))
            continue
        try:
            sa, sb = judge(t, base)
        except Exception as e:  # noqa: BLE001 - one bad pair must not end the evaluation
            errors += 1
            logging.getLogger(__name__).warning("eval judge failed on seed %s: %s", t.seed, e)
            continue
        ties += sa == sb
        points.append(1.0 if sa > sb else 0.5 if sa == sb else 0.0)
    return {
        "eval/judge/win_rate": sum(points) / len(points) if points else float("nan"),
        "eval/judge/ties": float(ties),
        "eval/judge/pairs": float(len(points)),
        "eval/judge/errors": float(errors),
        "eval/judge/seconds": time.perf_counter() - t0,
    }


def outcome_judge() -> ProgrammaticJudge:
    """The default programmatic judge: compares the trajectories' outcome rewards."""
    return ProgrammaticJudge.from_scorer(lambda t: t.outcome)


# ----------------------------------------------------------------------------- LLM judge
GENERIC_RUBRICS = {
    "research": Rubric(
        process=(
            "searches are relevant and well targeted",
            "evidence is read and used",
            "reasoning is sound",
        ),
        answer=("answer is correct", "answer is supported by the evidence", "answer is complete and concise"),
        process_weight=0.5,
        answer_weight=0.5,
    ),
}


def get_judge_rubric(name: str) -> Rubric | EnvJudge:
    """A generic rubric (``"research"``) or the ``EnvJudge`` an env publishes, by env id or family
    (``"travel"``, ``"travel-open"``). Raises ``KeyError`` naming the known ones otherwise."""
    if name in GENERIC_RUBRICS:
        return GENERIC_RUBRICS[name]
    published = env_judge(name)
    if published is None:
        raise KeyError(
            f"no rubric {name!r}: use {', '.join(sorted(GENERIC_RUBRICS))}, or an env id or family "
            "whose env publishes a judge (register(..., judge='module:attr'))"
        )
    return published


class _Rubrics(Mapping):
    """``RUBRICS[name]``: the generic rubrics, and the rubric of any env that publishes a judge."""

    def __getitem__(self, name: str) -> Rubric:
        found = get_judge_rubric(name)
        return found.rubric if isinstance(found, EnvJudge) else found

    def __iter__(self) -> Iterator[str]:
        return iter(GENERIC_RUBRICS)

    def __len__(self) -> int:
        return len(GENERIC_RUBRICS)


RUBRICS: Mapping[str, Rubric] = _Rubrics()

PROMPT = """You are judging two attempts (A and B) at the same task by an AI agent that uses tools.

# Task
{task}

# Attempt A
{a}

# Attempt B
{b}

Score each attempt from 0 to 10 on every dimension.
Process dimensions: {process}
Answer dimensions: {answer}

Reply with JSON only, in this shape:
{{"A": {{"process": [{zeros_p}], "answer": [{zeros_a}]}}, "B": {{"process": [{zeros_p}], "answer": [{zeros_a}]}}}}
"""


def render_attempt(traj: Trajectory, max_chars: int = 6000) -> str:
    """The agent's actions and the observations it got, as plain text (clipped to ``max_chars``)."""
    lines = []
    for turn in traj.turns:
        lines.append(f"[assistant] {turn.action.content}")
        lines.extend(f"[{m.role}] {m.content}" for m in turn.observation)
    text = "\n".join(lines) or "(no actions)"
    return text if len(text) <= max_chars else text[: max_chars // 2] + "\n...\n" + text[-max_chars // 2 :]


def render_task(traj: Trajectory) -> str:
    return "\n".join(m.content for m in traj.prompt if m.role == "user") or "(no task text)"


def parse_scores(text: str, rubric: Rubric) -> tuple[float, float]:
    """Combined scores of A and B from a judge's reply: :func:`turngym.core.judging.parse_judge_reply`."""
    return parse_judge_reply(text, rubric)


class LLMJudge:
    """A pairwise judge through any text backend: ``complete(prompt) -> reply`` (sync or async).

    ``rubric``: a ``Rubric``, an env's ``EnvJudge``, or a name for :func:`get_judge_rubric`
    (``"research"``, or an env id/family that publishes a judge such as ``"travel"``). With an
    ``EnvJudge`` that has its own prompt, ``complete`` gets that prompt as a list of chat messages
    (``openai_complete`` and ``backend_complete`` take both); otherwise it gets the generic prompt
    string over the rubric. Every reply goes through the one parser, ``parse_judge_reply``.

    Each order is asked up to ``1 + retries`` times until the reply parses; an order that never
    parses counts as a tie (both sides get the midpoint 5) and adds to ``judge/parse_failures``.
    """

    def __init__(
        self, complete: Callable[[Any], Any], rubric: str | Rubric | EnvJudge = "research", retries: int = 2
    ):
        self.complete = complete
        found = get_judge_rubric(rubric) if isinstance(rubric, str) else rubric
        self.env_judge = found if isinstance(found, EnvJudge) else None
        self.rubric = found.rubric if isinstance(found, EnvJudge) else found
        self.retries = retries
        self._counters = _Counters()

    @property
    def metrics(self) -> dict[str, float]:
        return self._counters.snapshot()

    def prompt(self, a: Trajectory, b: Trajectory) -> str | list[dict[str, str]]:
        """The env's own judge messages when it publishes them, else the generic prompt text."""
        if self.env_judge is not None and self.env_judge.messages is not None:
            return self.env_judge.messages(a, b)
        r = self.rubric
        return PROMPT.format(
            task=render_task(a),
            a=render_attempt(a),
            b=render_attempt(b),
            process="; ".join(r.process),
            answer="; ".join(r.answer),
            zeros_p=", ".join("0" for _ in r.process),
            zeros_a=", ".join("0" for _ in r.answer),
        )

    def _ask(self, prompt: str | list[dict[str, str]]) -> str:
        reply = self.complete(prompt)
        if inspect.isawaitable(reply):
            reply = asyncio.run(_await(reply))
        return str(reply)

    def _one_order(self, first: Trajectory, second: Trajectory) -> tuple[float, float]:
        prompt = self.prompt(first, second)
        for attempt in range(self.retries + 1):
            try:
                reply = self._ask(prompt)
                return parse_judge_reply(reply, self.rubric)
            except JudgeParseError:
                self._counters.add("judge/retries" if attempt < self.retries else "judge/parse_failures")
            except Exception:  # noqa: BLE001 - a dead backend is a failed match, not a crashed step
                self._counters.add("judge/backend_errors")
                if attempt == self.retries:
                    self._counters.add("judge/parse_failures")
        return 5.0, 5.0

    def __call__(self, a: Trajectory, b: Trajectory) -> tuple[float, float]:
        ab = self._one_order(a, b)
        ba = self._one_order(b, a)
        sa, sb = ab[0] + ba[1], ab[1] + ba[0]
        self._counters.add("judge/matches")
        if sa == sb:
            self._counters.add("judge/ties")
        return sa, sb


async def _await(x: Any) -> Any:
    return await x


def _as_messages(prompt: str | list[dict[str, str]]) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)


def openai_complete(base_url: str, model: str, api_key: str = "EMPTY", timeout: float = 120.0, **params: Any):
    """``complete(prompt)`` over an OpenAI-compatible ``/chat/completions`` endpoint (vLLM, OpenAI, ...);
    ``prompt`` is a user message's text or a list of chat messages."""
    import httpx

    client = httpx.Client(
        base_url=base_url.rstrip("/"), timeout=timeout, headers={"Authorization": f"Bearer {api_key}"}
    )

    def complete(prompt: str | list[dict[str, str]]) -> str:
        body = {"model": model, "messages": _as_messages(prompt), **params}
        resp = client.post("/chat/completions", json=body)
        resp.raise_for_status()
        return resp.json()["choices"][0]["message"]["content"] or ""

    return complete


def backend_complete(backend: Any, tokenizer: Any, max_tokens: int = 256, temperature: float = 0.0):
    """``complete(prompt)`` through a turngym token ``Backend`` (HF in-process, vLLM) and a chat template;
    ``prompt`` is a user message's text or a list of chat messages."""
    from turngym.agents.backend import SamplingParams

    sampling = SamplingParams(max_tokens=max_tokens, temperature=temperature)

    async def complete(prompt: str | list[dict[str, str]]) -> str:
        text = tokenizer.apply_chat_template(_as_messages(prompt), tokenize=False, add_generation_prompt=True)
        ids = list(tokenizer.encode(text, add_special_tokens=False))
        gen = await backend.generate(ids, sampling)
        return gen.text

    return complete
