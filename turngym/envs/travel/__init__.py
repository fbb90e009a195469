"""travel: TravelPlanner-style planning over a seeded sandbox database (``travel-planner``, ``travel-open``).

Modules (import what you need; this package imports nothing heavy):

* :mod:`.database` — ``get_database(seed)`` (generated once, cached as parquet),
  ``load_travelplanner_csv(root)`` for the published database, ``TravelDB`` lookups.
* :mod:`.generate` — the deterministic generator (TravelPlanner's tables and columns, 304 US cities).
* :mod:`.models` — ``Query`` (TravelPlanner's query JSONL format), ``DayPlan``, ``parse_plan``.
* :mod:`.queries` — ``sample_task``: a feasible itinerary first, then the query derived from it.
* :mod:`.evaluate` — ``evaluate_plan(query, plan, db)``: 8 commonsense + 5 hard checks;
  ``aggregate_metrics``: delivery rate, commonsense/hard micro and macro, final pass rate.
* :mod:`.verifier` — DeepTravel-style grounding of every plan item in this episode's tool results.
* :mod:`.env` — ``TravelPlannerEnv`` / ``TravelOpenEnv`` (reward components documented there).
* :mod:`.judge` — pairwise judges for ``travel-open`` in the ``arena`` credit method:

  - programmatic: ``turngym.envs.travel.judge:pairwise_scores`` (``(traj_a, traj_b) -> (score_a,
    score_b)``, one order, 0–10) or ``score_trajectory`` for ``ProgrammaticJudge.from_scorer``;
  - LLM: ``RUBRIC_PROMPT`` (process breadth/relevance/detail, answer relevance/feasibility/
    details/clarity, combined 0.6 process / 0.4 answer), ``judge_messages(a, b)``,
    ``parse_judge_reply(text)``, ``llm_pairwise(complete)`` (retries, then a tie);
    ``TRAVEL_RUBRIC`` (a ``turngym.core.judging.Rubric``; ``RUBRIC`` is the same as a dict);
  - ``JUDGE``: the ``EnvJudge`` both travel envs publish (their spec's ``judge``), which the
    trainer's ``arena`` credit finds by env id.
* :mod:`.baselines` — scripted planners without privileged data (greedy-cheap, random).
"""
