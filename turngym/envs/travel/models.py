"""Pydantic models of TravelPlanner's query and plan formats.

* :class:`Query`: one record of TravelPlanner's query files (``org, dest, days,
  visiting_city_number, date, people_number, local_constraint, budget, query, level``);
  ``date`` and ``local_constraint`` may also be the Python-literal strings the published dataset
  uses. :func:`load_queries` reads JSONL, a JSON list, a single JSON object or CSV.
* :class:`DayPlan`: one day of a plan (``days, current_city, transportation, breakfast,
  attraction, lunch, dinner, accommodation``). A field left out stays ``None`` — *absent*,
  which the "complete information" check counts against the plan, exactly like a missing
  key in TravelPlanner; ``"-"`` means "nothing on purpose".
"""

from __future__ import annotations

import ast
import csv
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

PLAN_FIELDS = (
    "current_city",
    "transportation",
    "breakfast",
    "attraction",
    "lunch",
    "dinner",
    "accommodation",
)
Level = Literal["easy", "medium", "hard"]


class PlanError(ValueError):
    """A submitted plan that cannot be read (the message says what to fix)."""


class LocalConstraint(BaseModel):
    """The hard constraints of a query; ``None`` = not constrained."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    house_rule: str | None = Field(None, alias="house rule")
    cuisine: list[str] | None = None
    room_type: str | None = Field(None, alias="room type")
    transportation: str | None = None

    @field_validator("house_rule")
    @classmethod
    def _rule_alias(cls, v: str | None) -> str | None:
        return "parties" if v == "parities" else v  # TravelPlanner's evaluator spells it "parities"

    @field_validator("cuisine", mode="before")
    @classmethod
    def _cuisine_list(cls, v: Any) -> Any:
        if isinstance(v, str):
            return [v]
        return v or None

    def to_travelplanner(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True)

    def active(self) -> list[str]:
        """The names (TravelPlanner's keys) of the constraints that are set."""
        return [k for k, v in self.to_travelplanner().items() if v is not None]


MAX_LITERAL_CHARS = 100_000  # a query's literal fields are a few hundred characters


def _python_literal(text: str, what: str) -> Any:
    """A Python literal (as TravelPlanner's files store ``date`` and ``local_constraint``), else the
    same value written as JSON (``null`` rather than ``None``); ``ast.literal_eval`` evaluates no code."""
    if len(text) > MAX_LITERAL_CHARS:
        raise ValueError(f"not {what}: {len(text)} characters (the limit is {MAX_LITERAL_CHARS})")
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    try:
        return json.loads(text)
    except ValueError:
        raise ValueError(f"not {what}: {text[:80]!r}") from None


class Query(BaseModel):
    """A travel request in TravelPlanner's format."""

    model_config = ConfigDict(extra="ignore")

    org: str
    dest: str
    days: int = Field(ge=1, le=30)
    visiting_city_number: int = Field(ge=1)
    date: list[str]
    people_number: int = Field(ge=1)
    local_constraint: LocalConstraint = Field(default_factory=LocalConstraint)
    budget: float = Field(ge=0)
    query: str = ""
    level: Level = "easy"

    @field_validator("local_constraint", mode="before")
    @classmethod
    def _literal(cls, v: Any) -> Any:
        if isinstance(v, str):
            return _python_literal(v, "a Python dict literal")  # as the published dataset stores it
        return v if v is not None else {}

    @field_validator("date", mode="before")
    @classmethod
    def _dates(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = v.strip()
            return _python_literal(v, "a Python list literal") if v.startswith("[") else [v]
        return v

    def to_travelplanner(self) -> dict[str, Any]:
        out = self.model_dump()
        out["local_constraint"] = self.local_constraint.to_travelplanner()
        return out


def load_queries(path: str | Path) -> list[Query]:
    """Read TravelPlanner queries from a JSONL file (one object per line), a JSON list of objects, a
    JSON file holding one object, or a ``.csv`` file with a header row (as the Hugging Face copy of
    the dataset ships its splits; empty cells count as absent).

    The dataset's Python-literal fields (``date``, ``local_constraint``) are read by :class:`Query`.
    A malformed file raises ``ValueError`` naming the file, the line (``FILE:LINE:``) or the record
    (``FILE: record N:``, counted from 1) and what is wrong.
    """
    if Path(path).suffix.lower() == ".csv":
        return _csv_queries(path)
    text = Path(path).read_text(encoding="utf-8-sig")
    lines = text.splitlines()
    first = next((n for n, line in enumerate(lines, 1) if line.strip()), None)
    if first is None:
        raise ValueError(f"{path}: no queries in the file (expected JSONL, a JSON list or a JSON object)")
    head = lines[first - 1].strip()
    if head.startswith("{") and _parses(head):  # JSONL (a single one-line object is JSONL too)
        records = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
        return [_query(f"{path}:{n}:", _json(path, line, line=n)) for n, line in records]
    if not head.startswith(("{", "[")):
        raise ValueError(
            f"{path}:{first}: expected a JSON object, a JSON list of objects or JSONL (one object per "
            f"line), got {head[:40]!r}"
        )
    data = _json(path, text)
    if isinstance(data, dict):
        return [_query(f"{path}:", data)]
    return [_query(f"{path}: record {i}:", rec) for i, rec in enumerate(data, 1)]


def _csv_queries(path: str | Path) -> list[Query]:
    out = []
    with Path(path).open(encoding="utf-8-sig", newline="") as fh:
        reader = csv.DictReader(fh)
        if not reader.fieldnames:
            raise ValueError(f"{path}: no queries in the file (expected a header row and one query per row)")
        for row in reader:
            if None in row:  # more cells than header names
                raise ValueError(f"{path}:{reader.line_num}: the row has more cells than the header")
            out.append(
                _query(f"{path}:{reader.line_num}:", {k: v for k, v in row.items() if v not in ("", None)})
            )
    if not out:
        raise ValueError(f"{path}: no queries in the file (a header row but no query rows)")
    return out


#: the former name (the loader reads more than JSONL now)
load_queries_jsonl = load_queries


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _json(path: str | Path, text: str, line: int | None = None) -> Any:
    """``text`` parsed (the whole file, or its line ``line``); errors say ``FILE:LINE: ... at column C``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{line or e.lineno}: not valid JSON ({e.msg} at column {e.colno})") from None


def _query(where: str, record: Any) -> Query:
    if not isinstance(record, dict):
        raise ValueError(f"{where} a query must be a JSON object, got {type(record).__name__}")
    try:
        return Query.model_validate(record)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(map(str, err['loc'])) or 'query'}: {err['msg']}" for err in e.errors()
        )
        raise ValueError(f"{where} not a TravelPlanner query: {problems}") from None


class DayPlan(BaseModel):
    """One day of a plan in TravelPlanner's format (``None`` = field absent)."""

    model_config = ConfigDict(extra="ignore")

    days: int
    current_city: str | None = None
    transportation: str | None = None
    breakfast: str | None = None
    attraction: str | None = None
    lunch: str | None = None
    dinner: str | None = None
    accommodation: str | None = None

    @field_validator(*PLAN_FIELDS, mode="before")
    @classmethod
    def _text(cls, v: Any) -> Any:
        if isinstance(v, list) and all(isinstance(x, str) for x in v):
            return ";".join(v) + (";" if v else "")  # a list of attractions, written TravelPlanner's way
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return str(v)
        return v

    def unit(self) -> dict[str, Any]:
        """The TravelPlanner dict of this day (absent fields left out)."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


def parse_plan(obj: Any) -> list[DayPlan]:
    """A plan from a list of day dicts, a ``{"plan": [...]}`` dict or the JSON text of either.

    Raises :class:`PlanError` with a message fit for the model to read.
    """
    if isinstance(obj, str):
        text = obj.strip()
        if text.startswith("```"):
            text = text.strip("`").removeprefix("json").strip()
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise PlanError(
                f"the plan is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})"
            ) from e
    if isinstance(obj, dict) and "plan" in obj:
        obj = obj["plan"]
    if isinstance(obj, BaseModel):
        obj = obj.model_dump()
    if not isinstance(obj, list) or not obj:
        raise PlanError("the plan must be a non-empty JSON list of days")
    days = []
    for i, day in enumerate(obj, 1):
        if isinstance(day, DayPlan):
            days.append(day)
            continue
        if not isinstance(day, dict):
            raise PlanError(
                f"day {i} of the plan must be an object with the fields days, {', '.join(PLAN_FIELDS)}"
            )
        day = {"days": i, **day}
        try:
            days.append(DayPlan.model_validate(day))
        except ValidationError as e:
            errs = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors())
            raise PlanError(f"day {i} of the plan is malformed: {errs}") from e
    if len(days) > 60:
        raise PlanError(f"the plan has {len(days)} days; at most 60 are read")
    return days
