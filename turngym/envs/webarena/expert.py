"""Scripted experts for the generated arena tasks, acting through the same tools a model uses.

One small policy per intent template: it reads the current URL and page (the pruned DOM), moves
toward the page the task is about (by clicking links where the site offers them, by ``goto``
otherwise), acts there (buttons, forms, selects) and ends with ``stop`` — with an answer read off
the page for information-seeking tasks, never copied from the reference.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from turngym.core.registry import keyed_decorator
from turngym.envs.browser.dom import Node, Snapshot
from turngym.envs.browser.env import Calls, call

FORUM, TRACKER = "http://forum.local", "http://tracker.local"


@dataclass
class ExpertContext:
    """What an expert sees besides the page: its notes from earlier turns, and the open tabs."""

    memory: dict[str, Any] = field(default_factory=dict)
    tabs: list[str] = field(default_factory=list)  # display URLs
    active: int = 0


Policy = Callable[[dict[str, Any], str, Snapshot, ExpertContext], "Calls | None"]
_POLICIES: dict[int, Policy] = {}


def arena_expert_action(
    task: dict[str, Any], url: str, snap: Snapshot, ctx: ExpertContext | None = None
) -> Calls | None:
    """The next action for ``task`` on the page at ``url`` (a display URL); None if not covered."""
    policy = _POLICIES.get(int(task.get("intent_template_id", -1)))
    return policy(task["instantiation_dict"], url, snap, ctx or ExpertContext()) if policy else None


_policy = keyed_decorator(_POLICIES)


# ------------------------------------------------------------------ helpers
def _node(snap: Snapshot, role: str, name: str | None = None, startswith: str | None = None) -> Node | None:
    for n in snap.nodes:
        if n.id is None or n.role != role:
            continue
        if name is not None and n.name.strip() != name:
            continue
        if startswith is not None and not n.name.startswith(startswith):
            continue
        return n
    return None


def _click(snap: Snapshot, role: str, name: str) -> Calls | None:
    n = _node(snap, role, name)
    return [call("click", bid=n.id)] if n else None


def _submit(snap: Snapshot, button: str, *fields: tuple[str, str, str]) -> Calls | None:
    """Fill a form's ``fields`` (role, label, value: a combobox is set with ``select_option``, a
    textbox with ``fill``) and click its ``button``; None unless all of them are on the page."""
    nodes = [_node(snap, role, label) for role, label, _ in fields]
    press = _node(snap, "button", button)
    if press is None or any(n is None for n in nodes):
        return None
    acts = [
        call("select_option", bid=n.id, options=value)
        if role == "combobox"
        else call("fill", bid=n.id, value=value)
        for n, (role, _, value) in zip(nodes, fields, strict=True)
    ]
    return [*acts, call("click", bid=press.id)]


def _path(url: str) -> str:
    return urlsplit(url).path.rstrip("/") or "/"


def _query(url: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(url).query)


def _create(
    title: str, url: str, snap: Snapshot, form: str, button: str, *fields: tuple[str, str, str]
) -> Calls | None:
    """Create something titled ``title`` through the form at path ``form``: stop once the page shows
    its heading, fill and submit the form when on it; None elsewhere (the caller navigates)."""
    if any(n.role == "heading" and n.name == title for n in snap.nodes):
        return _stop()
    return _submit(snap, button, *fields) if _path(url) == form else None


def _stop(answer: str = "") -> Calls:
    return [call("stop", answer=answer)]


def _after(snap: Snapshot, pred: Callable[[Node], bool], role: str) -> Node | None:
    """The first node of ``role`` after the first node matching ``pred``."""
    seen = False
    for n in snap.nodes:
        if seen and n.role == role and n.id is not None:
            return n
        seen = seen or pred(n)
    return None


def _to_post(inst: dict[str, Any], url: str, snap: Snapshot) -> Calls | None:
    """Navigate to the task's post through its forum listing; None once there."""
    post = f"/f/{inst['forum']}/{inst['post_id']}"
    if _path(url) == post:
        return None
    if _path(url) == f"/f/{inst['forum']}":
        link = _node(snap, "link", inst["title"])
        if link:
            return [call("click", bid=link.id)]
    return [call("goto", url=f"{FORUM}/f/{inst['forum']}")]


def _issue_url(inst: dict[str, Any]) -> str:
    return f"{TRACKER}/{inst['project']}/-/issues/{inst['iid']}"


def _to_issue(inst: dict[str, Any], url: str) -> Calls | None:
    return None if _path(url) == _path(_issue_url(inst)) else [call("goto", url=_issue_url(inst))]


def _going(to: Callable[[dict[str, Any], str, Snapshot], Calls | None]) -> Callable[[Policy], Policy]:
    """Make a policy go first where ``to`` leads (``to`` is None once there), then act."""

    def deco(act: Policy) -> Policy:
        @functools.wraps(act)
        def policy(inst: dict[str, Any], url: str, snap: Snapshot, ctx: ExpertContext) -> Calls | None:
            return to(inst, url, snap) or act(inst, url, snap, ctx)

        return policy

    return deco


_on_post = _going(_to_post)
_on_issue = _going(lambda inst, url, snap: _to_issue(inst, url))


def _read_open_count(inst: dict[str, Any], url: str, snap: Snapshot) -> str | None:
    """The open-issue count shown on the project's (open) issue list, if that is the page."""
    if _path(url) == f"/{inst['project']}/-/issues" and _query(url).get("state", ["opened"]) == ["opened"]:
        count = next((n for n in snap.nodes if re.match(r"\d+ issues \(", n.name)), None)
        return count.name.split()[0] if count else None
    return None


def _read_top_title(inst: dict[str, Any], url: str, snap: Snapshot) -> str | None:
    """The first post title of the forum's top-sorted listing, if that is the page."""
    if _path(url) == f"/f/{inst['forum']}" and _query(url).get("sort") == ["top"]:
        first = _after(snap, lambda n: n.name.endswith(" points"), "link")
        return first.name if first else None
    return None


def _looking_up(
    key: str,
    reader: Callable[[dict[str, Any], str, Snapshot], str | None],
    where: Callable[[dict[str, Any]], str],
) -> Callable[[Policy], Policy]:
    """Make a policy first read a value in a second tab, then act with it in ``ctx.memory[key]``: open
    ``where(inst)`` in a new tab, read it there with ``reader`` (None: not on that page, go there),
    remember it and close the tab."""

    def look_up(inst: dict[str, Any], url: str, snap: Snapshot, ctx: ExpertContext) -> Calls | None:
        if key in ctx.memory:
            return [call("tab_close")] if len(ctx.tabs) > 1 else None
        if len(ctx.tabs) < 2:
            return [call("new_tab", url=where(inst))]
        value = reader(inst, url, snap)
        if value is None:
            return [call("goto", url=where(inst))]
        ctx.memory[key] = value
        return [call("tab_close")]

    def deco(act: Policy) -> Policy:
        @functools.wraps(act)
        def policy(inst: dict[str, Any], url: str, snap: Snapshot, ctx: ExpertContext) -> Calls | None:
            return look_up(inst, url, snap, ctx) or act(inst, url, snap, ctx)

        return policy

    return deco


# ------------------------------------------------------------------ forum
@_policy(100)
@_on_post
def _comments(inst, url, snap, ctx):
    head = next(
        (n for n in snap.nodes if n.role == "heading" and re.fullmatch(r"\d+ comments", n.name)), None
    )
    return _stop(head.name.split()[0]) if head else None


@_policy(101)
@_on_post
def _author(inst, url, snap, ctx):
    author = _after(snap, lambda n: n.role == "heading" and n.name == inst["title"], "link")
    return _stop(author.name) if author else None


@_policy(102)
def _top_sorted(inst, url, snap, ctx):
    if _path(url) == f"/f/{inst['forum']}":
        if _query(url).get("sort") == ["top"]:
            return _stop()
        return _click(snap, "link", "Top")
    return [call("goto", url=f"{FORUM}/f/{inst['forum']}")]


@_policy(103)
@_on_post
def _upvote(inst, url, snap, ctx):
    if "(you upvoted)" in snap.text():
        return _stop()
    return _click(snap, "button", "Upvote")


@_policy(104)
@_on_post
def _reply(inst, url, snap, ctx):
    if any(n.name == inst["text"] for n in snap.nodes):
        return _stop()
    return _submit(snap, "Post comment", ("textbox", "Comment", inst["text"]))


@_policy(105)
def _create_post(inst, url, snap, ctx):
    fields = [("combobox", "Forum", inst["forum"]), ("textbox", "Title", inst["title"])]
    created = _create(
        inst["title"], url, snap, "/submit", "Create post", *fields, ("textbox", "Body", inst["body"])
    )
    return created or _click(snap, "link", "Submit") or [call("goto", url=f"{FORUM}/submit")]


@_policy(106)
def _subscribe(inst, url, snap, ctx):
    if _path(url) != f"/f/{inst['forum']}":
        return [call("goto", url=f"{FORUM}/f/{inst['forum']}")]
    if _node(snap, "button", "Unsubscribe"):
        return _stop()
    return _click(snap, "button", "Subscribe")


@_policy(107)
def _top_title(inst, url, snap, ctx):
    title = _read_top_title(inst, url, snap)
    return _stop(title) if title is not None else [call("goto", url=f"{FORUM}/f/{inst['forum']}?sort=top")]


# ------------------------------------------------------------------ tracker
@_policy(200)
def _open_count(inst, url, snap, ctx):
    count = _read_open_count(inst, url, snap)
    if count is not None:
        return _stop(count)
    if _path(url) == f"/{inst['project']}":
        link = _node(snap, "link", startswith="Issues (")
        if link:
            return [call("click", bid=link.id)]
    return [call("goto", url=f"{TRACKER}/{inst['project']}")]


@_policy(201)
@_on_issue
def _assignee(inst, url, snap, ctx):
    line = next((n for n in snap.nodes if n.name.startswith("Assignee: ")), None)
    return _stop(line.name.split(": ", 1)[1]) if line else None


@_policy(202)
def _label_list(inst, url, snap, ctx):
    if _path(url) == f"/{inst['project']}/-/issues":
        if _query(url).get("label_name") == [inst["label"]]:
            return _stop()
        return _click(snap, "link", inst["label"])
    return [call("goto", url=f"{TRACKER}/{inst['project']}/-/issues")]


@_policy(203)
@_on_issue
def _close(inst, url, snap, ctx):
    if _node(snap, "button", "Reopen issue"):
        return _stop()
    return _click(snap, "button", "Close issue")


@_policy(204)
@_on_issue
def _assign(inst, url, snap, ctx):
    if any(n.name == f"Assignee: {inst['user']}" for n in snap.nodes):
        return _stop()
    return _submit(snap, "Save assignee", ("combobox", "Assignee", inst["user"]))


@_policy(205)
@_on_issue
def _add_label(inst, url, snap, ctx):
    line = next((n for n in snap.nodes if n.name.startswith("Labels: ")), None)
    if line and inst["label"] in line.name.split(": ", 1)[1].split(", "):
        return _stop()
    return _submit(snap, "Add label", ("combobox", "Add label", inst["label"]))


@_policy(206)
def _new_issue(inst, url, snap, ctx):
    fields = [("textbox", "Title", inst["title"]), ("textbox", "Description", inst["description"])]
    created = _create(inst["title"], url, snap, f"/{inst['project']}/-/issues/new", "Create issue", *fields)
    if created:
        return created
    if _path(url) == f"/{inst['project']}":
        return _click(snap, "link", "New issue")
    return [call("goto", url=f"{TRACKER}/{inst['project']}")]


@_policy(207)
def _open_issue(inst, url, snap, ctx):
    if _path(url) == _path(_issue_url(inst)):
        return _stop()
    if _path(url) == f"/{inst['project']}/-/issues" and _query(url).get("state") == ["all"]:
        link = _node(snap, "link", inst["title"])
        if link:
            return [call("click", bid=link.id)]
    return [call("goto", url=f"{TRACKER}/{inst['project']}/-/issues?state=all")]


# ------------------------------------------------------------------ both sites, two tabs
@_policy(300)
@_looking_up("count", _read_open_count, lambda inst: f"{TRACKER}/{inst['project']}/-/issues")
def _comment_open_count(inst, url, snap, ctx):
    text = f"{inst['project']} has {ctx.memory['count']} open issues"
    return _reply({**inst, "text": text}, url, snap, ctx)


@_policy(301)
@_looking_up("top", _read_top_title, lambda inst: f"{FORUM}/f/{inst['forum']}?sort=top")
def _issue_from_top_post(inst, url, snap, ctx):
    return _new_issue({**inst, "description": ctx.memory["top"]}, url, snap, ctx)
