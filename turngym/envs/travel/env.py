"""``travel-planner`` and ``travel-open``: multi-day itineraries with search tools over a sandbox.

Tools: ``search_flights``, ``search_accommodations``, ``search_restaurants``,
``search_attractions``, ``distance``, ``search_cities``, ``notebook_write`` and the terminal
``submit_plan(plan)`` (a list of days in TravelPlanner's format; a malformed plan is an error
observation and the episode goes on).

Rewards (``info["reward_components"]``; the scalar ``reward`` is **only** ``pass`` — the other
components are per-check results and critics for credit methods, and do not add to it):

* ``pass`` (submit turn, or the last turn when nothing was submitted): 1.0 iff the plan
  passes all 8 commonsense and all applicable hard checks (TravelPlanner's final pass).
* ``cs.<check>`` / ``hard.<check>`` (submit turn): 1.0/0.0 per check; hard checks appear only
  when evaluated and set by the query (see :mod:`.evaluate`).
* ``verifier`` (submit turn): fraction of plan items found in this episode's tool results.
* ``tool_ok`` (turns with search calls): fraction of this turn's search calls that returned data.

Gated credit (G-RA): ``high_component="pass"``, ``low_components=("tool_ok", "verifier")``;
turn credit: ``TurnRewards(("tool_ok", "verifier"))``. ``info["grounding"]`` on the submit
turn says which turn supplied each plan item.

``travel-open`` (:class:`TravelOpenEnv`): the same world and tools with an open-ended request
(preferences instead of requirements). It has no checkable answer: ``pass`` is not paid, the
outcome reward is the neutral 0.0, and rewards come from a pairwise judge through the
``arena`` credit method — see :mod:`turngym.envs.travel.judge`. Its submit turn carries
``info["judge_features"]`` for the programmatic judge.
"""

from __future__ import annotations

import datetime as dt
import difflib
import hashlib
import json
from typing import Any

import numpy as np

from turngym.core.env import Task
from turngym.core.types import Message, ToolResult
from turngym.envs.travel.database import TravelDB, get_database, normalize_mode
from turngym.envs.travel.evaluate import PlanEvaluation, evaluate_plan
from turngym.envs.travel.models import DayPlan, PlanError, Query, load_queries, parse_plan
from turngym.envs.travel.parsing import before_parenthesis
from turngym.envs.travel.queries import LEVELS, SampledTask, open_request, sample_task
from turngym.envs.travel.schema import ACCOMMODATIONS, ATTRACTIONS, FLIGHTS, RESTAURANTS
from turngym.envs.travel.verifier import GroundingReport, Ledger
from turngym.tools import ToolError, tool
from turngym.tools.env import Env

PLAN_FORMAT = """Submit the plan with submit_plan: a JSON list with one object per day, in TravelPlanner's format:
{"days": 1, "current_city": "from Dallas to Denver", "transportation": "<the flight or road leg as the tool returned it>",
 "breakfast": "-", "attraction": "Red Rocks Park, Denver;", "lunch": "Rosa's Grill, Denver", "dinner": "Blue Table, Denver",
 "accommodation": "Cozy loft near downtown, Denver"}
Rules: write places as "Name, City"; end every attraction with ";"; write "-" for nothing; on a day that
moves between cities current_city is "from A to B"; the trip starts and ends at the origin; transportation
entries look like "Flight Number: F123, from A to B, Departure Time: 08:00, Arrival Time: 10:00" or
"Self-driving, from A to B, ..." / "Taxi, from A to B, ..." (never mix self-driving with flights or taxis)."""


class TravelPlannerEnv(Env):
    """TravelPlanner: plan a trip that satisfies every commonsense and hard constraint."""

    default_max_turns = 30
    open_ended = False
    forkable = True
    #: shared with forks, never copied: the sandbox database and the loaded queries (read-only)
    _fork_shared = ("db", "queries")

    def __init__(
        self,
        db_seed: int = 0,
        n_cities: int | None = None,
        n_days: int = 31,
        db_path: str | None = None,
        cache_dir: str | None = None,
        queries_path: str | None = None,
        level: str | None = None,
        days: int | None = None,
        strict: bool = True,
        max_rows: int = 60,
        **kwargs: Any,
    ):
        if level is not None and level not in LEVELS:
            raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
        if days is not None and days not in (3, 5, 7):
            raise ValueError(f"days must be 3, 5 or 7, got {days}")
        self.db: TravelDB = get_database(db_seed, n_cities, n_days, cache_dir=cache_dir, path=db_path)
        self.queries: list[Query] | None = load_queries(queries_path) if queries_path else None
        self.level, self.days, self.strict, self.max_rows = level, days, strict, max_rows
        super().__init__(**kwargs)
        self._sampled: SampledTask | None = None
        self._query: Query | None = None
        self._ledger = Ledger()
        self._notes: list[str] = []
        self._plan: list[DayPlan] | None = None
        self._evaluation: PlanEvaluation | None = None
        self._grounding: GroundingReport | None = None
        self._submitted_turn: int | None = None
        self._expert_step = 0
        self._expert_script: list[str] | None = None

    # ---------------------------------------------------------------- tools
    @tool
    def search_flights(self, origin: str, destination: str, date: str) -> str:
        """Search flights from one city to another on a date.

        Args:
            origin: departure city, e.g. "Dallas"
            destination: arrival city
            date: departure date as YYYY-MM-DD
        """
        o, d, day = self._city(origin), self._city(destination), self._date(date)
        rows = self.db.flights(o, d, day)
        self._ledger.add_flights(rows, self.turn)
        if not rows:
            return f"There is no flight from {o} to {d} on {day}."
        return self._clip(self.db.table_text(FLIGHTS, o, d, day))

    @tool
    def search_accommodations(self, city: str) -> str:
        """List the accommodations of a city (price per night, room type, house rules, minimum nights,
        maximum occupancy, review rate).

        Args:
            city: the city
        """
        return self._places(ACCOMMODATIONS, city)

    @tool
    def search_restaurants(self, city: str) -> str:
        """List the restaurants of a city (average cost per person, cuisines, rating).

        Args:
            city: the city
        """
        return self._places(RESTAURANTS, city)

    @tool
    def search_attractions(self, city: str) -> str:
        """List the attractions of a city.

        Args:
            city: the city
        """
        return self._places(ATTRACTIONS, city)

    @tool
    def distance(self, origin: str, destination: str, mode: str = "self-driving") -> str:
        """Road distance, duration and cost between two cities.

        Args:
            origin: departure city
            destination: arrival city
            mode: "self-driving" or "taxi"
        """
        o, d = self._city(origin), self._city(destination)
        m = normalize_mode(mode)
        if m is None:
            raise ToolError(f"unknown mode {mode!r}: use 'self-driving' or 'taxi'")
        row = self.db.road(o, d, m)
        if row is None or row["cost"] is None:
            return f"{m}, from {o} to {d}, no valid information."
        self._ledger.add_road(o, d, m, self.turn)
        return f"{m}, from {o} to {d}, duration: {row['duration']}, distance: {row['distance']}, cost: {row['cost']}"

    @tool
    def search_cities(self, state: str) -> str:
        """List the cities of a state that the database covers.

        Args:
            state: a US state, e.g. "Texas"
        """
        s = self.db.canonical_state(before_parenthesis(state))
        if s is None:
            raise ToolError(f"unknown state {state!r}.{_hint(state, list(self.db.state_cities))}")
        return f"Cities in {s}: " + ", ".join(self.db.state_cities[s])

    @tool
    def notebook_write(self, text: str) -> str:
        """Save a note (e.g. a candidate flight or restaurant) to the episode's notebook.

        Args:
            text: what to remember
        """
        if not text.strip():
            raise ToolError("the note is empty")
        if len(self._notes) >= 200:
            raise ToolError("the notebook is full (200 notes)")
        self._notes.append(text[:2000])
        return f"Saved note {len(self._notes)}."

    @tool(terminal=True)
    def submit_plan(self, plan: list[dict[str, Any]] | str) -> str:
        """Submit the final day-by-day plan; ends the episode.

        Args:
            plan: list of days, each {"days", "current_city", "transportation", "breakfast", "attraction",
                "lunch", "dinner", "accommodation"} (or the JSON text of that list)
        """
        try:
            days = parse_plan(plan)
        except PlanError as e:
            raise ToolError(f"{e}. {PLAN_FORMAT.splitlines()[0]}") from e
        assert self._query is not None
        self._plan = days
        self._submitted_turn = self.turn
        self._evaluation = evaluate_plan(self._query, days, self.db, strict=self.strict)
        self._grounding = self._ledger.check(days)
        return f"Plan received ({len(days)} days)."

    # ------------------------------------------------------------- helpers
    def _city(self, name: str) -> str:
        city = self.db.canonical_city(before_parenthesis(str(name)))
        if city is None:
            raise ToolError(f"unknown city {name!r}.{_hint(name, self.db.cities)}")
        return city

    def _date(self, date: str) -> str:
        try:
            day = dt.date.fromisoformat(str(date).strip()).isoformat()
        except ValueError:
            raise ToolError(f"bad date {date!r}: use YYYY-MM-DD") from None
        dates = self.db.dates
        if dates and not dates[0] <= day <= dates[-1]:
            raise ToolError(f"no data for {day}: the database covers {dates[0]} to {dates[-1]}")
        return day

    def _places(self, table: str, city: str) -> str:
        c = self._city(city)
        rows = {ACCOMMODATIONS: self.db.accommodations, RESTAURANTS: self.db.restaurants}.get(
            table, self.db.attractions
        )(c)
        self._ledger.add_places(table, rows, self.turn)
        if not rows:
            return f"There is no {table[:-1]} in {c}."
        return f"{table.capitalize()} in {c}:\n" + self._clip(self.db.table_text(table, c))

    def _clip(self, text: str) -> str:
        lines = text.split("\n")
        if len(lines) - 1 <= self.max_rows:
            return text
        return (
            "\n".join(lines[: self.max_rows + 1])
            + f"\n({len(lines) - 1 - self.max_rows} more rows not shown)"
        )

    # ----------------------------------------------------------------- env
    def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> Task:
        self._ledger = Ledger()
        self._notes = []
        self._plan = self._evaluation = self._grounding = None
        self._submitted_turn = None
        self._expert_step = 0
        self._expert_script: list[str] | None = None
        self._sampled = None
        if self.queries is not None:
            index = int(options.get("query_index", rng.integers(len(self.queries))))
            if not 0 <= index < len(self.queries):
                raise ValueError(f"query_index {index} out of range (0..{len(self.queries) - 1})")
            self._query = self.queries[index].model_copy(deep=True)
        else:
            level = options.get("level", self.level)
            days = options.get("days", self.days)
            self._sampled = sample_task(self.db, rng, level=level, days=int(days) if days else None)
            self._query = self._sampled.query
        q = self._query
        request, prefs = open_request(q, rng) if self.open_ended else (q.query, [])
        if self._sampled is not None:
            self._sampled.preferences = prefs
        digest = hashlib.sha1(q.model_dump_json().encode()).hexdigest()[:10]
        reference: dict[str, Any] = {"query": q.to_travelplanner()}
        if self._sampled is not None:
            reference["plan"] = [d.unit() for d in self._sampled.plan]
            reference["searches"] = [{"name": n, "arguments": a} for n, a in self._sampled.searches]
        system = (
            "You are a travel planning agent. Gather flights, road legs, accommodations, restaurants and "
            "attractions with the tools, then submit a complete day-by-day plan. Use only what the tools "
            "return.\n" + PLAN_FORMAT + "\n" + self.tool_instructions()
        )
        kind = "open" if self.open_ended else q.level
        return Task(
            messages=[Message(role="system", content=system.strip()), Message(role="user", content=request)],
            task_id=f"travel-{kind}-{q.days}d-{digest}",
            reference=reference,
            info={"level": q.level, "days": q.days},
        )

    def _turn_reward(self, results: list[ToolResult], done: bool) -> dict[str, float]:
        out: dict[str, float] = {}
        searches = [r for r in results if r.name not in ("submit_plan", "notebook_write")]
        if searches:
            useful = [
                r
                for r in searches
                if r.ok and not r.content.startswith("There is no") and "no valid" not in r.content
            ]
            out["tool_ok"] = len(useful) / len(searches)
        submitted_now = self._submitted_turn == self.turn and self._evaluation is not None
        if submitted_now:
            assert self._evaluation is not None and self._grounding is not None
            out.update(self._evaluation.components())
            out["verifier"] = self._grounding.rate
        elif done and self._evaluation is None:
            out["pass"] = 0.0
        if self.open_ended:
            out.pop("pass", None)
        return out

    def _reward(self, components: dict[str, float]) -> float:
        """Only the final pass is paid (none in open mode); the other components are diagnostics."""
        return 0.0 if self.open_ended else float(components.get("pass", 0.0))

    def _step_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {}
        if self._submitted_turn == self.turn and self._evaluation is not None:
            info["plan_evaluation"] = {
                "final_pass": self._evaluation.final_pass,
                "failures": self._evaluation.failures(),
                "total_cost": self._evaluation.total_cost,
            }
            info["grounding"] = self._grounding.to_dict() if self._grounding else None
            if self.open_ended:
                info["judge_features"] = self.judge_features()
        elif self.open_ended and self._done:
            info["judge_features"] = self.judge_features()
        return info

    def judge_features(self) -> dict[str, float]:
        """The soft scores the programmatic judge compares (see :mod:`.judge`)."""
        from turngym.envs.travel.judge import features_from_episode

        q = self._query
        places = [q.org, q.dest, *self.db.state_cities.get(q.dest, [])] if q is not None else []
        return features_from_episode(
            q, self._evaluation, self._grounding, self._call_history, self._plan, places
        )

    def _state_key(self) -> str:
        task = self.task.task_id if self.task else ""
        looked = sorted({c for c in self._call_history if not c.startswith("notebook_write")})
        return hashlib.sha1(json.dumps([task, looked]).encode()).hexdigest()[:16]

    def expert_action(self) -> str | None:
        """The scripted expert's next action: for a sampled query, the searches that find the
        sampled plan and then that plan; for a loaded query (no gold plan), the greedy-cheap
        planner's searches and plan (:mod:`.baselines`). None once the script is spent."""
        if self._done or self._query is None:
            return None
        if self._expert_script is None:
            if self._sampled is not None:
                calls = [
                    *self._sampled.searches,
                    ("submit_plan", {"plan": [d.unit() for d in self._sampled.plan]}),
                ]
                self._expert_script = [self.format_call(n, a) for n, a in calls]
            else:
                from turngym.envs.travel.baselines import planner_actions

                self._expert_script = planner_actions(
                    "greedy", self._query, self.db, np.random.default_rng(0)
                )
        if self._expert_step >= len(self._expert_script):
            return None
        self._expert_step += 1
        return self._expert_script[self._expert_step - 1]


class TravelOpenEnv(TravelPlannerEnv):
    """travel-open: the same world with open-ended requests; judged pairwise (arena), outcome 0."""

    open_ended = True


def _hint(name: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(str(name), choices, n=3, cutoff=0.6)
    return f" Did you mean {', '.join(close)}?" if close else ""
