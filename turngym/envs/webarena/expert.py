"""Scripted experts for the generated arena tasks, acting through the same tools a model uses.

One small policy per intent template: it reads the current URL and page (the pruned DOM), moves
toward the page the task is about (by clicking links where the site offers them, by ``goto``
otherwise), acts there (buttons, forms, selects) and ends with ``stop`` — with an answer read off
the page for information-seeking tasks, never copied from the reference.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

from turngym.envs.web.dom import Node, Snapshot
from turngym.envs.web.expert import call

FORUM, TRACKER = "http://forum.local", "http://tracker.local"
Policy = Callable[[dict[str, Any], str, Snapshot], "str | None"]
_POLICIES: dict[int, Policy] = {}


def arena_expert_action(task: dict[str, Any], url: str, snap: Snapshot) -> str | None:
    """The next action for ``task`` on the page at ``url`` (a display URL); None if not covered."""
    policy = _POLICIES.get(int(task.get("intent_template_id", -1)))
    return policy(task["instantiation_dict"], url, snap) if policy else None


def _policy(*ids: int) -> Callable[[Policy], Policy]:
    def deco(fn: Policy) -> Policy:
        for i in ids:
            _POLICIES[i] = fn
        return fn

    return deco


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


def _click(snap: Snapshot, role: str, name: str) -> str | None:
    n = _node(snap, role, name)
    return call("click", bid=n.id) if n else None


def _path(url: str) -> str:
    return urlsplit(url).path.rstrip("/") or "/"


def _query(url: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(url).query)


def _stop(answer: str = "") -> str:
    return call("stop", answer=answer)


def _after(snap: Snapshot, pred: Callable[[Node], bool], role: str) -> Node | None:
    """The first node of ``role`` after the first node matching ``pred``."""
    seen = False
    for n in snap.nodes:
        if seen and n.role == role and n.id is not None:
            return n
        seen = seen or pred(n)
    return None


def _to_post(inst: dict[str, Any], url: str, snap: Snapshot) -> str | None:
    """Navigate to the task's post through its forum listing; None once there."""
    post = f"/f/{inst['forum']}/{inst['post_id']}"
    if _path(url) == post:
        return None
    if _path(url) == f"/f/{inst['forum']}":
        link = _node(snap, "link", inst["title"])
        if link:
            return call("click", bid=link.id)
    return call("goto", url=f"{FORUM}/f/{inst['forum']}")


def _issue_url(inst: dict[str, Any]) -> str:
    return f"{TRACKER}/{inst['project']}/-/issues/{inst['iid']}"


def _to_issue(inst: dict[str, Any], url: str) -> str | None:
    return None if _path(url) == _path(_issue_url(inst)) else call("goto", url=_issue_url(inst))


# ------------------------------------------------------------------ forum
@_policy(100)
def _comments(inst, url, snap):
    go = _to_post(inst, url, snap)
    if go:
        return go
    head = next(
        (n for n in snap.nodes if n.role == "heading" and re.fullmatch(r"\d+ comments", n.name)), None
    )
    return _stop(head.name.split()[0]) if head else None


@_policy(101)
def _author(inst, url, snap):
    go = _to_post(inst, url, snap)
    if go:
        return go
    author = _after(snap, lambda n: n.role == "heading" and n.name == inst["title"], "link")
    return _stop(author.name) if author else None


@_policy(102)
def _top_sorted(inst, url, snap):
    if _path(url) == f"/f/{inst['forum']}":
        if _query(url).get("sort") == ["top"]:
            return _stop()
        return _click(snap, "link", "Top")
    return call("goto", url=f"{FORUM}/f/{inst['forum']}")


@_policy(103)
def _upvote(inst, url, snap):
    go = _to_post(inst, url, snap)
    if go:
        return go
    if "(you upvoted)" in snap.text():
        return _stop()
    return _click(snap, "button", "Upvote")


@_policy(104)
def _reply(inst, url, snap):
    go = _to_post(inst, url, snap)
    if go:
        return go
    if any(n.name == inst["text"] for n in snap.nodes):
        return _stop()
    box, button = _node(snap, "textbox", "Comment"), _node(snap, "button", "Post comment")
    if not box or not button:
        return None
    return call("fill", bid=box.id, value=inst["text"]) + "\n" + call("click", bid=button.id)


@_policy(105)
def _create_post(inst, url, snap):
    if any(n.role == "heading" and n.name == inst["title"] for n in snap.nodes):
        return _stop()
    if _path(url) == "/submit":
        forum, title, body = (
            _node(snap, "combobox", "Forum"),
            _node(snap, "textbox", "Title"),
            _node(snap, "textbox", "Body"),
        )
        button = _node(snap, "button", "Create post")
        if not (forum and title and body and button):
            return None
        return "\n".join(
            [
                call("select_option", bid=forum.id, options=inst["forum"]),
                call("fill", bid=title.id, value=inst["title"]),
                call("fill", bid=body.id, value=inst["body"]),
                call("click", bid=button.id),
            ]
        )
    return _click(snap, "link", "Submit") or call("goto", url=f"{FORUM}/submit")


@_policy(106)
def _subscribe(inst, url, snap):
    if _path(url) != f"/f/{inst['forum']}":
        return call("goto", url=f"{FORUM}/f/{inst['forum']}")
    if _node(snap, "button", "Unsubscribe"):
        return _stop()
    return _click(snap, "button", "Subscribe")


@_policy(107)
def _top_title(inst, url, snap):
    if _path(url) != f"/f/{inst['forum']}" or _query(url).get("sort") != ["top"]:
        return call("goto", url=f"{FORUM}/f/{inst['forum']}?sort=top")
    first = _after(snap, lambda n: n.name.endswith(" points"), "link")
    return _stop(first.name) if first else None


# ------------------------------------------------------------------ tracker
@_policy(200)
def _open_count(inst, url, snap):
    if _path(url) == f"/{inst['project']}/-/issues" and _query(url).get("state", ["opened"]) == ["opened"]:
        count = next((n for n in snap.nodes if re.match(r"\d+ issues \(", n.name)), None)
        return _stop(count.name.split()[0]) if count else None
    if _path(url) == f"/{inst['project']}":
        link = _node(snap, "link", startswith="Issues (")
        if link:
            return call("click", bid=link.id)
    return call("goto", url=f"{TRACKER}/{inst['project']}")


@_policy(201)
def _assignee(inst, url, snap):
    go = _to_issue(inst, url)
    if go:
        return go
    line = next((n for n in snap.nodes if n.name.startswith("Assignee: ")), None)
    return _stop(line.name.split(": ", 1)[1]) if line else None


@_policy(202)
def _label_list(inst, url, snap):
    if _path(url) == f"/{inst['project']}/-/issues":
        if _query(url).get("label_name") == [inst["label"]]:
            return _stop()
        return _click(snap, "link", inst["label"])
    return call("goto", url=f"{TRACKER}/{inst['project']}/-/issues")


@_policy(203)
def _close(inst, url, snap):
    go = _to_issue(inst, url)
    if go:
        return go
    if _node(snap, "button", "Reopen issue"):
        return _stop()
    return _click(snap, "button", "Close issue")


@_policy(204)
def _assign(inst, url, snap):
    go = _to_issue(inst, url)
    if go:
        return go
    if any(n.name == f"Assignee: {inst['user']}" for n in snap.nodes):
        return _stop()
    select, button = _node(snap, "combobox", "Assignee"), _node(snap, "button", "Save assignee")
    if not select or not button:
        return None
    return call("select_option", bid=select.id, options=inst["user"]) + "\n" + call("click", bid=button.id)


@_policy(205)
def _add_label(inst, url, snap):
    go = _to_issue(inst, url)
    if go:
        return go
    line = next((n for n in snap.nodes if n.name.startswith("Labels: ")), None)
    if line and inst["label"] in line.name.split(": ", 1)[1].split(", "):
        return _stop()
    select, button = _node(snap, "combobox", "Add label"), _node(snap, "button", "Add label")
    if not select or not button:
        return None
    return call("select_option", bid=select.id, options=inst["label"]) + "\n" + call("click", bid=button.id)


@_policy(206)
def _new_issue(inst, url, snap):
    if any(n.role == "heading" and n.name == inst["title"] for n in snap.nodes):
        return _stop()
    if _path(url) == f"/{inst['project']}/-/issues/new":
        title, desc = _node(snap, "textbox", "Title"), _node(snap, "textbox", "Description")
        button = _node(snap, "button", "Create issue")
        if not (title and desc and button):
            return None
        return "\n".join(
            [
                call("fill", bid=title.id, value=inst["title"]),
                call("fill", bid=desc.id, value=inst["description"]),
                call("click", bid=button.id),
            ]
        )
    if _path(url) == f"/{inst['project']}":
        return _click(snap, "link", "New issue")
    return call("goto", url=f"{TRACKER}/{inst['project']}")


@_policy(207)
def _open_issue(inst, url, snap):
    if _path(url) == _path(_issue_url(inst)):
        return _stop()
    if _path(url) == f"/{inst['project']}/-/issues" and _query(url).get("state") == ["all"]:
        link = _node(snap, "link", inst["title"])
        if link:
            return call("click", bid=link.id)
    return call("goto", url=f"{TRACKER}/{inst['project']}/-/issues?state=all")
