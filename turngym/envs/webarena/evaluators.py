"""WebArena's three evaluator kinds, as in its ``evaluation_harness/evaluators.py``.

* ``string_match`` — the agent's final answer against ``reference_answers``: ``exact_match``
  (after WebArena's ``clean_answer``: strip, drop one pair of surrounding quotes, lower-case),
  ``must_include`` (each item a substring; a single one-word reference must be a whole token), and
  ``fuzzy_match`` (WebArena asks an LLM; here only through a judge callable you pass, else an error).
* ``url_match`` — the final URL against ``reference_url`` (alternatives split by ``" |OR| "``) with
  the ``"GOLD in PRED"`` rule: a reference's host+path must be contained in the final URL's and every
  query parameter of the references must have one of its values in the final URL.
* ``program_html`` — a list of checks, each: open ``url`` (``"last"`` = the final page), select content
  with ``locator`` (``""`` = the page's HTML; ``document...`` = JavaScript run in the page) and
  compare it with ``required_contents`` (``exact_match`` or ``must_include`` with ``" |OR| "``
  alternatives). WebArena's ``func:`` locators call Python helpers that read the site's state; their
  local equivalent is ``sql:<query>``: a read-only SQL query against the database of the site named
  by ``url`` (a placeholder such as ``__TRACKER__``), its rows rendered one per line, columns joined
  by ``" | "``.

The score of a task is the product of its evaluators' scores (1.0 = success).
"""

from __future__ import annotations

import collections
import html
import re
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

Judge = Callable[[str, str, str], float]  # (intent, reference, prediction) -> score in [0, 1]


class EvaluationError(ValueError):
    """A task's evaluation config cannot be evaluated here."""


def clean_answer(answer: str) -> str:
    answer = answer.strip()
    if len(answer) >= 2 and answer[0] == answer[-1] and answer[0] in "'\"":
        answer = answer[1:-1]
    return answer.lower()


def exact_match(ref: str, pred: str) -> float:
    return float(clean_answer(str(pred)) == clean_answer(str(ref)))


def _tokens(text: str) -> list[str]:
    return re.findall(r"\w+|[^\w\s]", text)


def must_include(ref: str, pred: str, tokenize: bool = False) -> float:
    ref_c, pred_c = clean_answer(str(ref)), clean_answer(str(pred))
    if tokenize and len(ref_c) == 1 and len(_tokens(ref_c)) == 1:
        return float(ref_c in _tokens(pred_c))  # "0" must not match inside "10"
    return float(ref_c in pred_c)


def string_match(config: dict[str, Any], answer: str, judge: Judge | None = None) -> float:
    refs = config["eval"].get("reference_answers") or {}
    pred = clean_answer(answer or "")
    score = 1.0
    for approach, value in refs.items():
        if approach == "exact_match":
            score *= exact_match(value, pred)
        elif approach == "must_include":
            values = value if isinstance(value, list) else [value]
            for v in values:
                score *= must_include(v, pred, tokenize=len(values) == 1)
        elif approach == "fuzzy_match":
            if value == "N/A":
                score *= exact_match("N/A", pred)
                continue
            if judge is None:
                raise EvaluationError("fuzzy_match needs a judge (WebArena uses an LLM): pass judge=...")
            for v in value if isinstance(value, list) else [value]:
                score *= float(judge(config.get("intent", ""), str(v), pred))
        else:
            raise EvaluationError(f"unknown string_match approach {approach!r}")
    return score


def _clean_url(url: str) -> str:
    return str(url).rstrip("/")


def _parse_url(url: str) -> tuple[str, dict[str, list[str]]]:
    parts = urllib.parse.urlparse(url)
    return parts.netloc + parts.path, urllib.parse.parse_qs(parts.query)


def url_match(config: dict[str, Any], url: str) -> float:
    refs = [_clean_url(u) for u in str(config["eval"].get("reference_url", "")).split(" |OR| ") if u]
    if not refs:
        raise EvaluationError("url_match without reference_url")
    rule = config["eval"].get("url_note") or "GOLD in PRED"
    if rule != "GOLD in PRED":
        raise EvaluationError(f"unknown url_note {rule!r}")
    pred_base, pred_query = _parse_url(_clean_url(url))
    ref_bases, ref_queries = [], collections.defaultdict(set)
    for r in refs:
        base, query = _parse_url(r)
        ref_bases.append(base)
        for k, vs in query.items():
            ref_queries[k].update(vs)
    base_score = float(any(b in pred_base for b in ref_bases))
    query_score = 1.0
    for k, values in ref_queries.items():
        query_score *= float(any(v in pred_query.get(k, []) for v in values))
    return base_score * query_score


@dataclass
class ProgramContext:
    """How ``program_html`` reads the world: a page reader and a database reader."""

    #: (url or "last", JavaScript locator or "" for the HTML) -> the selected content as text
    read_page: Callable[[str, str], Awaitable[str]]
    #: (site placeholder or URL, SQL) -> rows
    query_db: Callable[[str, str], list[tuple[Any, ...]]]


def _rows_text(rows: list[tuple[Any, ...]]) -> str:
    return "\n".join(" | ".join("" if v is None else str(v) for v in row) for row in rows)


async def program_html(config: dict[str, Any], ctx: ProgramContext) -> float:
    score = 1.0
    for target in config["eval"].get("program_html") or []:
        url, locator = str(target.get("url", "last")), str(target.get("locator", ""))
        if url.startswith("func:") or locator.startswith("func:"):
            raise EvaluationError("func: locators run Python from the task file; use sql:<query> instead")
        if locator.startswith("sql:"):
            selected = _rows_text(ctx.query_db(url, locator[4:]))
        elif not locator.strip() or locator.startswith(("document.", "[...document.")):
            selected = await ctx.read_page(url, locator)
        else:
            raise EvaluationError(f"unknown locator {locator!r}")
        selected = html.unescape(selected or "")
        required = target.get("required_contents") or {}
        if "exact_match" in required:
            score *= exact_match(required["exact_match"], selected)
        elif "must_include" in required:
            for content in required["must_include"]:
                score *= float(any(must_include(c, selected) for c in str(content).split(" |OR| ")))
        else:
            raise EvaluationError(f"program_html target without required_contents: {target}")
    return score


async def evaluate(
    config: dict[str, Any],
    *,
    answer: str,
    url: str,
    ctx: ProgramContext | None = None,
    judge: Judge | None = None,
) -> tuple[float, dict[str, float]]:
    """Score a finished episode: the product over ``eval_types``, and each evaluator's score."""
    parts: dict[str, float] = {}
    for kind in config["eval"]["eval_types"]:
        if kind == "string_match":
            parts[kind] = string_match(config, answer, judge)
        elif kind == "url_match":
            parts[kind] = url_match(config, url)
        elif kind == "program_html":
            if ctx is None:
                raise EvaluationError("program_html needs a ProgramContext")
            parts[kind] = await program_html(config, ctx)
        else:
            raise EvaluationError(f"unknown eval type {kind!r}")
    score = 1.0
    for v in parts.values():
        score *= v
    return score, parts
