"""The built-in environments. Entry points are strings: nothing heavy is imported here.

One line per env id; each family adds its own.
"""

from turngym.core.registry import register

register(
    "arith-v0",
    "turngym.envs.arith.env:ArithEnv",
    family="arith",
    description="Evaluate a nested arithmetic expression with a calculator tool (the minimal example env).",
)

register(
    "search-qa-v0",
    "turngym.envs.search.env:SearchQAEnv",
    family="search",
    requires=("search",),
    description="Multi-hop QA with search(query, k) and answer(text) tools over a BM25-indexed corpus "
    "(a generated world by default; Search-R1 / FlashRAG / HotpotQA files on request).",
)
register(
    "search-r1-v0",
    "turngym.envs.search.env:SearchQAEnv",
    family="search",
    requires=("search",),
    parser="tags",
    description="search-qa with Search-R1's tag protocol and prompt (<search>, <information>, <answer>).",
)

register(
    "travel-planner-v0",
    "turngym.envs.travel.env:TravelPlannerEnv",
    family="travel",
    requires=("travel",),
    description="TravelPlanner: plan a multi-day trip with search tools over a seeded sandbox database; "
    "8 commonsense + 5 hard checks.",
)
register(
    "travel-open-v0",
    "turngym.envs.travel.env:TravelOpenEnv",
    family="travel",
    requires=("travel",),
    description="Open-ended travel requests in the travel-planner world; no checkable answer, judged pairwise (arena).",
)
