"""A Reddit/Postmill-like forum (WebArena's ``reddit`` site, in small): forums, posts, comments,
votes and subscriptions in SQLite, served by Starlette.

Pages: ``/`` (forums), ``/f/<forum>`` (posts; ``?sort=new|top``), ``/f/<forum>/<id>`` (a post, its
comments, vote buttons and a comment form), ``/submit`` (new post), ``/u/<user>`` (a profile),
``/search?q=`` (post titles). Every visitor is logged in as :data:`ME`.
"""

from __future__ import annotations

import sqlite3
from typing import Any
from urllib.parse import urlencode

import numpy as np

from turngym.envs.browser.sites.server import esc
from turngym.envs.browser.sites.storage import connect
from turngym.envs.webarena.sites.common import SiteApp, pick, redirect, usernames

NAME = "forum"
VERSION = 1
ME = "alex_rivera"

FORUMS = {
    "books": ("novel", "book", "author", "series", "audiobook"),
    "movies": ("film", "director", "sequel", "trilogy", "documentary"),
    "gaming": ("console", "speedrun", "indie game", "RPG", "controller"),
    "science": ("telescope", "experiment", "vaccine", "fossil", "particle"),
    "cooking": ("sourdough", "cast iron pan", "curry", "knife", "spice rack"),
    "travel": ("backpack", "train pass", "hostel", "visa", "layover"),
    "music": ("vinyl", "guitar", "playlist", "concert", "synth"),
    "technology": ("laptop", "keyboard", "router", "smartwatch", "monitor"),
    "fitness": ("deadlift", "marathon", "kettlebell", "protein", "stretching routine"),
    "photography": ("lens", "tripod", "film camera", "night sky shot", "portrait"),
    "history": ("empire", "archive", "castle", "treaty", "manuscript"),
    "diy": ("workbench", "drill", "shelf", "paint job", "soldering kit"),
}
_TITLES = (
    "What is your favorite {x}?", "Best {x} for beginners?", "I finally finished my {x} project",
    "Unpopular opinion about the {x}", "Need advice on choosing a {x}", "Is this {x} worth it?",
    "My {x} story from last weekend", "Looking for {x} recommendations", "Why does every {x} cost so much now?",
    "Weekly discussion: the {x}", "Just got my first {x}!", "Help: my {x} stopped working",
)  # fmt: skip
_BODIES = (
    "I have been thinking about this for a while and would love to hear what you all think.",
    "Posting here because this community always gives honest answers.",
    "Long time lurker, first post. Be gentle!",
    "Here is what happened, and I am still not sure what to make of it.",
    "Curious whether anyone else has run into the same thing.",
)
_COMMENTS = (
    "Great question, following.", "I had the same experience last year.", "Hard disagree, but interesting take.",
    "This is the answer.", "Thanks for sharing!", "Have you tried asking in the weekly thread?",
    "Came here to say this.", "Saving this for later.", "Can confirm, works for me too.", "Underrated post.",
)  # fmt: skip


def build(conn: sqlite3.Connection, seed: int = 0) -> None:
    """Generate the forum's data (~600 posts, ~3,500 comments) deterministically from ``seed``."""
    rng = np.random.default_rng([seed, 101])
    conn.executescript(
        """
        CREATE TABLE users (name TEXT PRIMARY KEY, karma INTEGER);
        CREATE TABLE forums (name TEXT PRIMARY KEY, description TEXT);
        CREATE TABLE subscriptions (user TEXT, forum TEXT, PRIMARY KEY (user, forum));
        CREATE TABLE posts (id INTEGER PRIMARY KEY, forum TEXT, author TEXT, title TEXT, body TEXT, score INTEGER,
                            created INTEGER);
        CREATE TABLE comments (id INTEGER PRIMARY KEY, post_id INTEGER, author TEXT, body TEXT, created INTEGER);
        CREATE TABLE votes (user TEXT, post_id INTEGER, value INTEGER, PRIMARY KEY (user, post_id));
        """
    )
    users = usernames(rng, 60)
    conn.executemany(
        "INSERT INTO users VALUES (?, ?)", [(u, int(rng.integers(1, 5000))) for u in [ME, *users]]
    )
    for f, topics in FORUMS.items():
        conn.execute(
            "INSERT INTO forums VALUES (?, ?)",
            (f, f"Everything about {f}: {', '.join(topics[:3])} and more."),
        )
        for u in rng.choice(users, size=int(rng.integers(5, 40)), replace=False):
            conn.execute("INSERT INTO subscriptions VALUES (?, ?)", (str(u), f))
    seen: set[str] = set()
    t = 1_700_000_000
    for f, topics in FORUMS.items():
        n = 0
        while n < 50:
            title = pick(rng, _TITLES).format(x=pick(rng, topics))
            title = title if title not in seen else f"{title} (part {n})"
            if title in seen:
                continue
            seen.add(title)
            t += int(rng.integers(60, 7200))
            cur = conn.execute(
                "INSERT INTO posts (forum, author, title, body, score, created) VALUES (?,?,?,?,?,?)",
                (f, pick(rng, users), title, pick(rng, _BODIES), int(rng.integers(-5, 300)), t),
            )
            for _ in range(int(rng.integers(0, 13))):
                t += int(rng.integers(10, 600))
                conn.execute(
                    "INSERT INTO comments (post_id, author, body, created) VALUES (?,?,?,?)",
                    (cur.lastrowid, pick(rng, users), pick(rng, _COMMENTS), t),
                )
            n += 1


class ForumApp(SiteApp):
    """The forum's ASGI app over a working database file."""

    def routes(self) -> list[Any]:
        from starlette.routing import Route

        return [
            Route("/", self.home),
            Route("/search", self.search),
            Route("/submit", self.submit, methods=["GET", "POST"]),
            Route("/u/{user}", self.user),
            Route("/f/{forum}", self.forum),
            Route("/f/{forum}/subscribe", self.subscribe, methods=["POST"]),
            Route("/f/{forum}/{post:int}", self.post),
            Route("/f/{forum}/{post:int}/vote", self.vote, methods=["POST"]),
            Route("/f/{forum}/{post:int}/comment", self.comment, methods=["POST"]),
        ]

    def header(self) -> str:
        return (
            "<nav><a href='/'>Forums</a><a href='/submit'>Submit</a>"
            f"<a href='/u/{ME}'>u/{ME}</a><form action='/search' method='get' style='display:inline'>"
            "<input type='text' name='q' aria-label='Search posts'><button type='submit'>Search</button></form></nav>"
        )

    async def home(self, request: Any) -> Any:
        return self._listing(
            "Forums",
            "SELECT f.name, f.description, (SELECT count(*) FROM subscriptions s WHERE s.forum = f.name) n, "
            "(SELECT count(*) FROM posts p WHERE p.forum = f.name) posts FROM forums f ORDER BY f.name",
            lambda r: (
                f"<li><a href='/f/{r['name']}'>f/{r['name']}</a> <span class='muted'>{r['n']} subscribers, "
                f"{r['posts']} posts</span> — {esc(r['description'])}</li>"
            ),
        )

    def _post_rows(self, rows: list[sqlite3.Row], with_forum: bool = False) -> str:
        out = []
        for r in rows:
            where = f" in <a href='/f/{r['forum']}'>f/{r['forum']}</a>" if with_forum else ""
            out.append(
                f"<article><span class='score'>{r['score']} points</span> "
                f"<a href='/f/{r['forum']}/{r['id']}'>{esc(r['title'])}</a><div class='muted'>submitted by "
                f"<a href='/u/{r['author']}'>{r['author']}</a>{where} · {r['ncom']} comments</div></article>"
            )
        return "".join(out) or "<p>No posts.</p>"

    _POSTS = "SELECT p.*, (SELECT count(*) FROM comments c WHERE c.post_id = p.id) ncom FROM posts p "

    async def forum(self, request: Any) -> Any:
        name = request.path_params["forum"]
        sort = request.query_params.get("sort", "new")
        order = "p.score DESC, p.id" if sort == "top" else "p.created DESC"
        with connect(self.db) as c:
            f = c.execute("SELECT * FROM forums WHERE name = ?", (name,)).fetchone()
            if f is None:
                return self._missing(f"forum f/{name}")
            rows = c.execute(self._POSTS + f"WHERE p.forum = ? ORDER BY {order}", (name,)).fetchall()
            n_subs = c.execute("SELECT count(*) FROM subscriptions WHERE forum = ?", (name,)).fetchone()[0]
            subbed = c.execute(
                "SELECT 1 FROM subscriptions WHERE forum = ? AND user = ?", (name, ME)
            ).fetchone()
        label = "Unsubscribe" if subbed else "Subscribe"
        body = (
            f"<h1>f/{name}</h1><p>{esc(f['description'])}</p><p>{n_subs} subscribers</p>"
            f"<form method='post' action='/f/{name}/subscribe'><button type='submit'>{label}</button></form>"
            f"<nav>Sort: <a href='/f/{name}?sort=new'>New</a><a href='/f/{name}?sort=top'>Top</a></nav>"
            + self._post_rows(rows)
        )
        return self._page(f"f/{name}", body)

    async def subscribe(self, request: Any) -> Any:
        name = request.path_params["forum"]
        with connect(self.db) as c:
            if c.execute("SELECT 1 FROM forums WHERE name = ?", (name,)).fetchone() is None:
                return self._missing(f"forum f/{name}")
            if c.execute("DELETE FROM subscriptions WHERE forum = ? AND user = ?", (name, ME)).rowcount == 0:
                c.execute("INSERT INTO subscriptions VALUES (?, ?)", (ME, name))
        return redirect(f"/f/{name}")

    async def post(self, request: Any) -> Any:
        name, pid = request.path_params["forum"], request.path_params["post"]
        with connect(self.db) as c:
            p = c.execute(self._POSTS + "WHERE p.id = ? AND p.forum = ?", (pid, name)).fetchone()
            if p is None:
                return self._missing(f"post {pid} in f/{name}")
            comments = c.execute("SELECT * FROM comments WHERE post_id = ? ORDER BY id", (pid,)).fetchall()
            vote = c.execute("SELECT value FROM votes WHERE user = ? AND post_id = ?", (ME, pid)).fetchone()
        mine = vote["value"] if vote else 0
        listing = "".join(
            f"<div class='comment'><a href='/u/{k['author']}'>{k['author']}</a>: <span class='comment-body'>"
            f"{esc(k['body'])}</span></div>"
            for k in comments
        )
        body = (
            f"<h1 class='post-title'>{esc(p['title'])}</h1><div class='muted'>submitted by "
            f"<a href='/u/{p['author']}'>{p['author']}</a> to <a href='/f/{name}'>f/{name}</a></div>"
            f"<p class='post-body'>{esc(p['body'])}</p>"
            f"<div><span class='score'>{p['score']} points</span>"
            f"{' (you upvoted)' if mine > 0 else ' (you downvoted)' if mine < 0 else ''}"
            f"<form method='post' action='/f/{name}/{pid}/vote' style='display:inline'>"
            "<button type='submit' name='value' value='1'>Upvote</button>"
            "<button type='submit' name='value' value='-1'>Downvote</button></form></div>"
            f"<h2>{p['ncom']} comments</h2>"
            f"<form method='post' action='/f/{name}/{pid}/comment'><textarea name='body' aria-label='Comment'>"
            "</textarea><button type='submit'>Post comment</button></form>"
            f"<div class='comments'>{listing}</div>"
        )
        return self._page(p["title"], body)

    async def vote(self, request: Any) -> Any:
        name, pid = request.path_params["forum"], request.path_params["post"]
        value = 1 if (await request.form()).get("value") == "1" else -1
        with connect(self.db) as c:
            if c.execute("SELECT 1 FROM posts WHERE id = ? AND forum = ?", (pid, name)).fetchone() is None:
                return self._missing(f"post {pid}")
            old = c.execute("SELECT value FROM votes WHERE user = ? AND post_id = ?", (ME, pid)).fetchone()
            old_v = old["value"] if old else 0
            new_v = 0 if old_v == value else value  # voting the same way again takes the vote back
            c.execute("DELETE FROM votes WHERE user = ? AND post_id = ?", (ME, pid))
            if new_v:
                c.execute("INSERT INTO votes VALUES (?, ?, ?)", (ME, pid, new_v))
            c.execute("UPDATE posts SET score = score + ? WHERE id = ?", (new_v - old_v, pid))
        return redirect(f"/f/{name}/{pid}")

    async def comment(self, request: Any) -> Any:
        name, pid = request.path_params["forum"], request.path_params["post"]
        text = str((await request.form()).get("body", "")).strip()
        with connect(self.db) as c:
            if c.execute("SELECT 1 FROM posts WHERE id = ? AND forum = ?", (pid, name)).fetchone() is None:
                return self._missing(f"post {pid}")
            if text:
                c.execute(
                    "INSERT INTO comments (post_id, author, body, created) VALUES (?, ?, ?, "
                    "(SELECT coalesce(max(created), 0) + 1 FROM comments))",
                    (pid, ME, text),
                )
        return redirect(f"/f/{name}/{pid}")

    async def submit(self, request: Any) -> Any:
        error = ""
        if request.method == "POST":
            form = await request.form()
            forum, title, text = (str(form.get(k, "")).strip() for k in ("forum", "title", "body"))
            with connect(self.db) as c:
                if c.execute("SELECT 1 FROM forums WHERE name = ?", (forum,)).fetchone() is None:
                    error = "Choose a forum."
                elif not title:
                    error = "The title is required."
                else:
                    cur = c.execute(
                        "INSERT INTO posts (forum, author, title, body, score, created) VALUES "
                        "(?, ?, ?, ?, 1, (SELECT coalesce(max(created), 0) + 1 FROM posts))",
                        (forum, ME, title, text),
                    )
                    return redirect(f"/f/{forum}/{cur.lastrowid}")
        with connect(self.db) as c:
            forums = [r[0] for r in c.execute("SELECT name FROM forums ORDER BY name")]
        opts = "".join(f"<option value='{f}'>{f}</option>" for f in forums)
        body = (
            "<h1>Create a post</h1>"
            + (f"<p class='error'>{esc(error)}</p>" if error else "")
            + "<form method='post' action='/submit'>"
            f"<label for='forum'>Forum</label><select name='forum' id='forum'><option value=''>Choose one</option>{opts}"
            "</select><br><label for='title'>Title</label><input type='text' name='title' id='title'><br>"
            "<label for='body'>Body</label><textarea name='body' id='body'></textarea><br>"
            "<button type='submit'>Create post</button></form>"
        )
        return self._page("Submit", body)

    async def user(self, request: Any) -> Any:
        name = request.path_params["user"]
        with connect(self.db) as c:
            u = c.execute("SELECT * FROM users WHERE name = ?", (name,)).fetchone()
            if u is None:
                return self._missing(f"user {name}")
            rows = c.execute(self._POSTS + "WHERE p.author = ? ORDER BY p.created DESC", (name,)).fetchall()
            n_com = c.execute("SELECT count(*) FROM comments WHERE author = ?", (name,)).fetchone()[0]
        body = (
            f"<h1>u/{name}</h1><p>{u['karma']} karma · {len(rows)} posts · {n_com} comments</p>"
            + self._post_rows(rows, with_forum=True)
        )
        return self._page(f"u/{name}", body)

    async def search(self, request: Any) -> Any:
        q = request.query_params.get("q", "").strip()
        rows: list[sqlite3.Row] = []
        if q:
            with connect(self.db) as c:
                rows = c.execute(
                    self._POSTS + "WHERE p.title LIKE ? ORDER BY p.created DESC LIMIT 50", (f"%{q}%",)
                ).fetchall()
        body = f"<h1>Search results for {esc(q)!s}</h1><p>{len(rows)} posts</p>" + self._post_rows(rows, True)
        return self._page(f"Search: {q}", body)


def search_url(q: str) -> str:
    return "/search?" + urlencode({"q": q})
