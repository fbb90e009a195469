"""A scripted WebShop expert that acts through the browser tools, reading the page like a model would.

It knows the goal (privileged: the target's title and ASIN), so it searches for the target's
title, opens the target from the results (paging with "Next >" if needed), clicks the goal's
option radio buttons and "Buy Now". Elsewhere (a sub-page, a wrong product) it goes back.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from turngym.envs.browser.dom import Snapshot
from turngym.envs.browser.env import Calls, call
from turngym.envs.webshop.goals import Goal


def shop_expert_action(goal: Goal, url: str, snap: Snapshot) -> Calls | None:
    """The next action (one or more tool calls) for the page at ``url``; None if it is stuck."""
    parts = urlsplit(url)
    path = [p for p in parts.path.split("/") if p]
    if path[:1] == ["item"] and len(path) >= 2:
        if len(path) > 2 or path[1] != goal.asin:
            return [call("go_back")]
        return _buy(goal, snap)
    if path == ["search"]:
        nodes = snap.nodes
        for i, n in enumerate(nodes):
            if (
                n.role == "link"
                and n.name == goal.name
                and i + 1 < len(nodes)
                and nodes[i + 1].name == goal.asin
            ):
                return [call("click", bid=n.id)]
        nxt = snap.find(role="link", name="Next >")
        searched = parse_qs(parts.query).get("q", [""])[0]
        if nxt and searched == goal.name:
            return [call("click", bid=nxt[0].id)]
    box = next((n for n in snap.nodes if n.role == "textbox" and n.name == "Search"), None)
    button = snap.find(role="button", name="Search")
    if box is None or not button:
        back = snap.find(role="link", name="Back to Search")
        return [call("click", bid=back[0].id)] if back else None
    return [call("fill", bid=box.id, value=goal.name), call("click", bid=button[0].id)]


def _buy(goal: Goal, snap: Snapshot) -> Calls | None:
    calls: Calls = []
    group, picked = None, set()
    wanted = goal.goal_options
    for n in snap.nodes:
        if n.role == "legend":
            group = n.name
        elif n.role != "radio" or group is None or group in picked:
            continue
        elif (
            wanted.get(group) if isinstance(wanted, dict) else (n.name if n.name in wanted else None)
        ) == n.name:
            picked.add(group)  # one value per option group (a list goal names values only)
            if not n.checked:
                calls.append(call("click", bid=n.id))
    buy = snap.find(role="button", name="Buy Now")
    if not buy:
        return None
    calls.append(call("click", bid=buy[0].id))
    return calls
