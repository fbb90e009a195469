"""A GitLab-like issue tracker (WebArena's ``gitlab`` site, in small): projects, issues, labels,
assignees and comments in SQLite, served by Starlette.

Pages: ``/`` (projects), ``/<project>`` (overview), ``/<project>/-/issues`` (list; filters
``state=opened|closed|all``, ``label_name``, ``assignee_username``, ``search``),
``/<project>/-/issues/<iid>`` (an issue: close/reopen, assignee, labels, comments),
``/<project>/-/issues/new``. Every visitor is logged in as :data:`ME`.
"""

from __future__ import annotations

import sqlite3
from typing import Any
from urllib.parse import urlencode

import numpy as np

from turngym.envs.browser.sites.server import esc
from turngym.envs.browser.sites.storage import connect
from turngym.envs.webarena.sites.common import SiteApp, pick, redirect, usernames

NAME = "tracker"
VERSION = 1
ME = "byte_blaze"

PROJECTS = {
    "payments-api": "REST API that processes card and bank payments.",
    "web-frontend": "The customer-facing single page app.",
    "mobile-app": "iOS and Android clients.",
    "data-pipeline": "Nightly ETL jobs and the warehouse loaders.",
    "auth-service": "Login, sessions, tokens and SSO.",
    "search-engine": "Indexing and query serving for product search.",
    "docs-site": "The public documentation website.",
    "infra-tools": "Deployment scripts, CI images and monitoring.",
}
LABELS = ("bug", "feature", "documentation", "performance", "security", "ui", "backend", "good first issue")
_COMPONENTS = (
    "login page", "checkout form", "settings panel", "export job", "search bar", "dashboard", "API client",
    "notification service", "cache layer", "upload dialog", "audit log", "rate limiter", "dark mode", "sidebar",
)  # fmt: skip
_PROBLEMS = (
    "crashes on {b}", "is slow with large inputs", "shows the wrong timezone", "ignores the retry setting",
    "leaks memory after an hour", "needs better error messages", "should support {b}", "returns 500 on empty input",
    "breaks when offline", "has a typo in the docs",
)  # fmt: skip
_THINGS = ("Safari", "Firefox", "Windows", "ARM64", "Python 3.12", "iPad", "slow networks", "unicode names")
_NOTES = (
    "I can reproduce this on main.", "Could this be related to the last release?", "Working on a fix.",
    "Needs a test case.", "Closing as duplicate would be wrong here, it is a different path.", "+1, seeing it too.",
)  # fmt: skip


def build(conn: sqlite3.Connection, seed: int = 0) -> None:
    """Generate the tracker's data (8 projects x 60 issues) deterministically from ``seed``."""
    rng = np.random.default_rng([seed, 202])
    conn.executescript(
        """
        CREATE TABLE users (name TEXT PRIMARY KEY);
        CREATE TABLE projects (name TEXT PRIMARY KEY, description TEXT);
        CREATE TABLE members (project TEXT, user TEXT, PRIMARY KEY (project, user));
        CREATE TABLE issues (project TEXT, iid INTEGER, title TEXT, body TEXT, state TEXT, author TEXT,
                             assignee TEXT, created INTEGER, PRIMARY KEY (project, iid));
        CREATE TABLE issue_labels (project TEXT, iid INTEGER, label TEXT, PRIMARY KEY (project, iid, label));
        CREATE TABLE notes (id INTEGER PRIMARY KEY, project TEXT, iid INTEGER, author TEXT, body TEXT);
        """
    )
    users = usernames(rng, 30)
    conn.executemany("INSERT INTO users VALUES (?)", [(u,) for u in [ME, *users]])
    t = 1_700_000_000
    for project, desc in PROJECTS.items():
        conn.execute("INSERT INTO projects VALUES (?, ?)", (project, desc))
        team = [ME, *(str(u) for u in rng.choice(users, size=7, replace=False))]
        conn.executemany("INSERT INTO members VALUES (?, ?)", [(project, u) for u in team])
        titles: set[str] = set()
        iid = 0
        while iid < 60:
            title = (
                f"{pick(rng, _COMPONENTS).capitalize()} {pick(rng, _PROBLEMS).format(b=pick(rng, _THINGS))}"
            )
            if title in titles:
                continue
            titles.add(title)
            iid += 1
            t += int(rng.integers(600, 86400))
            assignee = pick(rng, team) if rng.random() < 0.7 else None
            state = "closed" if rng.random() < 0.35 else "opened"
            conn.execute(
                "INSERT INTO issues VALUES (?,?,?,?,?,?,?,?)",
                (project, iid, title, f"Steps to reproduce: open the {title.split(' ')[0].lower()} ... "
                 f"Expected it to work, it did not.", state, pick(rng, team), assignee, t),
            )  # fmt: skip
            for lab in rng.choice(LABELS, size=int(rng.integers(0, 3)), replace=False):
                conn.execute("INSERT INTO issue_labels VALUES (?, ?, ?)", (project, iid, str(lab)))
            for _ in range(int(rng.integers(0, 4))):
                conn.execute(
                    "INSERT INTO notes (project, iid, author, body) VALUES (?,?,?,?)",
                    (project, iid, pick(rng, team), pick(rng, _NOTES)),
                )


class TrackerApp(SiteApp):
    """The tracker's ASGI app over a working database file."""

    def routes(self) -> list[Any]:
        from starlette.routing import Route

        return [
            Route("/", self.home),
            Route("/{project}", self.project),
            Route("/{project}/-/issues", self.issues),
            Route("/{project}/-/issues/new", self.new_issue, methods=["GET", "POST"]),
            Route("/{project}/-/issues/{iid:int}", self.issue),
            Route("/{project}/-/issues/{iid:int}/{action}", self.issue_action, methods=["POST"]),
        ]

    def header(self) -> str:
        return f"<nav><a href='/'>Projects</a><span class='muted'>Signed in as {ME}</span></nav>"

    async def home(self, request: Any) -> Any:
        return self._listing(
            "Projects",
            "SELECT p.name, p.description, (SELECT count(*) FROM issues i WHERE i.project = p.name AND "
            "i.state = 'opened') n FROM projects p ORDER BY p.name",
            lambda r: (
                f"<li><a href='/{r['name']}'>{r['name']}</a> — {esc(r['description'])} "
                f"<span class='muted'>{r['n']} open issues</span></li>"
            ),
        )

    async def project(self, request: Any) -> Any:
        name = request.path_params["project"]
        with connect(self.db) as c:
            p = c.execute("SELECT * FROM projects WHERE name = ?", (name,)).fetchone()
            if p is None:
                return self._missing(f"project {name}")
            n = c.execute(
                "SELECT count(*) FROM issues WHERE project = ? AND state = 'opened'", (name,)
            ).fetchone()[0]
            members = [
                r[0] for r in c.execute("SELECT user FROM members WHERE project = ? ORDER BY user", (name,))
            ]
        body = (
            f"<h1>{name}</h1><p>{esc(p['description'])}</p>"
            f"<nav><a href='/{name}/-/issues'>Issues ({n} open)</a><a href='/{name}/-/issues/new'>New issue</a></nav>"
            f"<h2>Members</h2><ul>{''.join(f'<li>{m}</li>' for m in members)}</ul>"
        )
        return self._page(name, body)

    async def issues(self, request: Any) -> Any:
        name = request.path_params["project"]
        qp = request.query_params
        state = qp.get("state", "opened")
        where, args = ["project = ?"], [name]
        if state in ("opened", "closed"):
            where.append("state = ?")
            args.append(state)
        if qp.get("label_name"):
            where.append(
                "EXISTS (SELECT 1 FROM issue_labels l WHERE l.project = i.project AND l.iid = i.iid AND l.label = ?)"
            )
            args.append(qp["label_name"])
        if qp.get("assignee_username"):
            where.append("assignee = ?")
            args.append(qp["assignee_username"])
        if qp.get("search"):
            where.append("title LIKE ?")
            args.append(f"%{qp['search']}%")
        with connect(self.db) as c:
            if c.execute("SELECT 1 FROM projects WHERE name = ?", (name,)).fetchone() is None:
                return self._missing(f"project {name}")
            rows = c.execute(
                f"SELECT * FROM issues i WHERE {' AND '.join(where)} ORDER BY iid DESC", args
            ).fetchall()
            labels = {
                (r["iid"]): r["ls"]
                for r in c.execute(
                    "SELECT iid, group_concat(label, ', ') ls FROM issue_labels WHERE project = ? GROUP BY iid",
                    (name,),
                )
            }
        keep = {k: v for k, v in qp.items() if k != "state"}
        tabs = " ".join(
            f"<a href='/{name}/-/issues?{urlencode({**keep, 'state': s})}'>{s.capitalize() if s != 'opened' else 'Open'}</a>"
            for s in ("opened", "closed", "all")
        )
        label_links = " ".join(
            f"<a href='/{name}/-/issues?{urlencode({'state': state, 'label_name': lab})}'>{lab}</a>"
            for lab in LABELS
        )
        items = "".join(
            f"<li><a href='/{name}/-/issues/{r['iid']}'>{esc(r['title'])}</a> <span class='muted'>#{r['iid']} · "
            f"{r['state']} · assignee: {r['assignee'] or 'none'} · labels: {labels.get(r['iid'], 'none')}</span></li>"
            for r in rows
        )
        filt = ", ".join(f"{k}={v}" for k, v in qp.items()) or "state=opened"
        body = (
            f"<h1>{name} issues</h1><nav>{tabs}</nav><nav>Labels: {label_links}</nav>"
            f"<form method='get' action='/{name}/-/issues'><input type='hidden' name='state' value='{esc(state)}'>"
            "<input type='text' name='search' aria-label='Search issues'><button type='submit'>Filter</button></form>"
            f"<p class='count'>{len(rows)} issues ({esc(filt)})</p><ul>{items}</ul>"
        )
        return self._page(f"Issues · {name}", body)

    async def issue(self, request: Any) -> Any:
        name, iid = request.path_params["project"], request.path_params["iid"]
        with connect(self.db) as c:
            i = c.execute("SELECT * FROM issues WHERE project = ? AND iid = ?", (name, iid)).fetchone()
            if i is None:
                return self._missing(f"issue #{iid} of {name}")
            labels = [
                r[0]
                for r in c.execute(
                    "SELECT label FROM issue_labels WHERE project=? AND iid=? ORDER BY label", (name, iid)
                )
            ]
            notes = c.execute(
                "SELECT * FROM notes WHERE project = ? AND iid = ? ORDER BY id", (name, iid)
            ).fetchall()
            members = [
                r[0] for r in c.execute("SELECT user FROM members WHERE project = ? ORDER BY user", (name,))
            ]
        act = f"/{name}/-/issues/{iid}"
        toggle = "Reopen issue" if i["state"] == "closed" else "Close issue"
        who = "".join(
            f"<option value='{m}'{' selected' if m == i['assignee'] else ''}>{m}</option>" for m in members
        )
        add = "".join(f"<option value='{lab}'>{lab}</option>" for lab in LABELS if lab not in labels)
        body = (
            f"<h1 class='issue-title'>{esc(i['title'])}</h1><p>#{iid} · <span class='state'>{i['state'].capitalize()}</span>"
            f" · opened by {i['author']}</p><p>{esc(i['body'])}</p>"
            f"<form method='post' action='{act}/toggle'><button type='submit'>{toggle}</button></form>"
            f"<p class='assignee'>Assignee: {i['assignee'] or 'none'}</p>"
            f"<form method='post' action='{act}/assign'><label for='assignee'>Assignee</label>"
            f"<select name='assignee' id='assignee'><option value=''>Unassigned</option>{who}</select>"
            "<button type='submit'>Save assignee</button></form>"
            f"<p class='labels'>Labels: {', '.join(labels) or 'none'}</p>"
            f"<form method='post' action='{act}/label'><label for='label'>Add label</label>"
            f"<select name='label' id='label'>{add}</select><button type='submit'>Add label</button></form>"
            f"<h2>Comments</h2><div class='notes'>"
            + "".join(f"<div class='note'><b>{n['author']}</b>: {esc(n['body'])}</div>" for n in notes)
            + f"</div><form method='post' action='{act}/comment'><textarea name='body' aria-label='Comment'></textarea>"
            "<button type='submit'>Comment</button></form>"
        )
        return self._page(f"{i['title']} (#{iid}) · {name}", body)

    async def issue_action(self, request: Any) -> Any:
        name, iid, action = (request.path_params[k] for k in ("project", "iid", "action"))
        form = await request.form()
        with connect(self.db) as c:
            i = c.execute("SELECT * FROM issues WHERE project = ? AND iid = ?", (name, iid)).fetchone()
            if i is None:
                return self._missing(f"issue #{iid} of {name}")
            if action == "toggle":
                c.execute(
                    "UPDATE issues SET state = ? WHERE project = ? AND iid = ?",
                    ("opened" if i["state"] == "closed" else "closed", name, iid),
                )
            elif action == "assign":
                c.execute(
                    "UPDATE issues SET assignee = ? WHERE project = ? AND iid = ?",
                    (form.get("assignee") or None, name, iid),
                )
            elif action == "label" and form.get("label") in LABELS:
                c.execute(
                    "INSERT OR IGNORE INTO issue_labels VALUES (?, ?, ?)", (name, iid, form.get("label"))
                )
            elif action == "comment" and str(form.get("body", "")).strip():
                c.execute(
                    "INSERT INTO notes (project, iid, author, body) VALUES (?,?,?,?)",
                    (name, iid, ME, str(form.get("body")).strip()),
                )
        return redirect(f"/{name}/-/issues/{iid}")

    async def new_issue(self, request: Any) -> Any:
        name = request.path_params["project"]
        with connect(self.db) as c:
            if c.execute("SELECT 1 FROM projects WHERE name = ?", (name,)).fetchone() is None:
                return self._missing(f"project {name}")
            error = ""
            if request.method == "POST":
                form = await request.form()
                title, text = str(form.get("title", "")).strip(), str(form.get("description", "")).strip()
                if title:
                    iid = c.execute(
                        "SELECT coalesce(max(iid), 0) + 1 FROM issues WHERE project = ?", (name,)
                    ).fetchone()[0]
                    c.execute(
                        "INSERT INTO issues VALUES (?,?,?,?, 'opened', ?, NULL, (SELECT max(created) + 1 FROM issues))",
                        (name, iid, title, text, ME),
                    )
                    return redirect(f"/{name}/-/issues/{iid}")
                error = "The title is required."
        body = (
            f"<h1>New issue in {name}</h1>"
            + (f"<p class='error'>{error}</p>" if error else "")
            + f"<form method='post' action='/{name}/-/issues/new'><label for='title'>Title</label>"
            "<input type='text' name='title' id='title'><br><label for='description'>Description</label>"
            "<textarea name='description' id='description'></textarea><br><button type='submit'>Create issue</button></form>"
        )
        return self._page(f"New issue · {name}", body)
