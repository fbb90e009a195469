"""The built-in environments. Entry points are strings: nothing heavy is imported here.

One line per env id; each family adds its own.
"""

from turngym.core.registry import register
from turngym.envs.browser.sites import register_site

register(
    "arith-v0",
    "turngym.envs.arith.env:ArithEnv",
    family="arith",
    description="Evaluate a nested arithmetic expression with a calculator tool (the minimal example env).",
)

register(
    "mcp-v0",
    "turngym.envs.mcp.env:McpEnv",
    family="mcp",
    requires=("interop",),
    judge="turngym.envs.mcp.judge:JUDGE",
    description="Tools from MCP servers (stdio commands or streamable-HTTP URLs, shared or one per episode) "
    "plus answer(text); tasks from a JSONL/JSON file; EM/F1 answer reward (a demo server and tasks by default).",
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
    judge="turngym.envs.travel.judge:JUDGE",
    description="TravelPlanner: plan a multi-day trip with search tools over a seeded sandbox database; "
    "8 commonsense + 5 hard checks.",
)
register(
    "travel-open-v0",
    "turngym.envs.travel.env:TravelOpenEnv",
    family="travel",
    requires=("travel",),
    judge="turngym.envs.travel.judge:JUDGE",
    description="Open-ended travel requests in the travel-planner world; no checkable answer, judged pairwise (arena).",
)

register(
    "swe-docker-v0",
    "turngym.envs.swe.env:SweDockerEnv",
    family="swe",
    requires=("docker",),
    description="Fix a real bug in a real Python package (inflection, cachetools, toolz) inside a "
    "network-less Docker container; reward = all FAIL_TO_PASS and PASS_TO_PASS tests pass.",
)

register(
    "web-miniwob-v0",
    "turngym.envs.web.env:WebMiniWoBEnv",
    family="web",
    requires=("web",),
    description="MiniWoB++ (130 tasks) in headless Chromium through the pruned DOM; BrowserGym-style tools "
    "by element id; the task's own JavaScript reward.",
)
register(
    "gui-miniwob-v0",
    "turngym.envs.gui.env:GuiMiniWoBEnv",
    family="gui",
    requires=("web",),
    description="MiniWoB++ through screenshots only; OSWorld computer_13-style mouse/keyboard tools at pixels.",
)
register(
    "gui-miniwob-grounding-v0",
    "turngym.envs.gui.grounding:GroundingMiniWoBEnv",
    family="gui",
    requires=("web",),
    description="Single-step GUI grounding on MiniWoB++ screenshots: click the named element; "
    "reward 1 if the point is inside its DOM box.",
)

register(
    "gui-desktop-v0",
    "turngym.envs.desktop.env:DesktopEnv",
    family="gui",
    requires=("desktop", "docker"),
    description="Real Debian desktop apps (mousepad, gnumeric, pcmanfm, xterm, galculator) under Xvfb in Docker; "
    "40 seeded tasks; screenshots (+ optional a11y tree, set-of-marks); checkers read the saved state.",
)
register(
    "gui-desktop-grounding-v0",
    "turngym.envs.desktop.grounding:GroundingDesktopEnv",
    family="gui",
    requires=("desktop", "docker"),
    description="Single-step grounding on real desktop screenshots: click the named element; reward 1 if the "
    "point is inside its accessibility-tree box.",
)

register(
    "web-shop-v0",
    "turngym.envs.webshop.env:WebShopEnv",
    family="web",
    requires=("web",),
    description="WebShop on a local shop (12k generated products, BM25 search, options, Buy Now) through the "
    "web-miniwob browser tools; WebShop's attribute/option/price x type reward.",
)
register(
    "web-arena-lite-v0",
    "turngym.envs.webarena.env:WebArenaEnv",
    family="web",
    requires=("web",),
    description="WebArena-style tasks (JSON format; string / URL / program evaluators) on a local forum and "
    "issue tracker, reset by restoring their SQLite files; browser tools plus goto/back/forward/tabs.",
)
for _site, _kind in (("forum", "forum (Reddit-like)"), ("tracker", "issue-tracker (GitLab-like)")):
    register(
        f"web-{_site}-v0",
        "turngym.envs.webarena.env:WebArenaEnv",
        family="web",
        requires=("web",),
        sites=[_site],
        description=f"web-arena-lite restricted to the {_kind} site.",
    )
del _site, _kind

register(
    "remote-v0",
    "turngym.remote.client:RemoteEnv",
    family="remote",
    requires=("interop",),
    description="Any env served by `turngym serve` on another machine, over WebSocket "
    "(make('remote', url=..., env_id=..., **env_kwargs)); episodes lost with the server are masked.",
)

# the local sites a person can serve (`turngym web serve SITE`); string entry points, like the envs
register_site("shop", "turngym.envs.webshop.app:serve_shop", "web-shop's store over the seeded catalog")
register_site("forum", "turngym.envs.webarena.sites:serve_site", "web-arena-lite's Reddit-like forum")
register_site(
    "tracker", "turngym.envs.webarena.sites:serve_site", "web-arena-lite's GitLab-like issue tracker"
)
