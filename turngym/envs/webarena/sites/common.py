"""What the arena-style sites share: the app base, word lists for generated people and text, request helpers."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from turngym.envs.browser.sites.server import esc, layout
from turngym.envs.browser.sites.storage import connect

ADJECTIVES = (
    "quiet", "brave", "lucky", "silver", "rapid", "mellow", "cosmic", "gentle", "bold", "sunny", "frosty", "clever",
    "dusty", "wild", "noble", "witty", "amber", "crimson", "hidden", "lazy",
)  # fmt: skip
ANIMALS = (
    "otter", "falcon", "panda", "lynx", "heron", "badger", "koala", "raven", "tiger", "whale", "gecko", "bison",
    "moose", "owl", "fox", "yak", "crane", "marten", "ibis", "seal",
)  # fmt: skip


def usernames(rng: np.random.Generator, n: int) -> list[str]:
    """``n`` distinct usernames like ``quiet_otter42``."""
    out: list[str] = []
    while len(out) < n:
        name = f"{ADJECTIVES[rng.integers(len(ADJECTIVES))]}_{ANIMALS[rng.integers(len(ANIMALS))]}{rng.integers(10, 99)}"
        if name not in out:
            out.append(name)
    return out


def pick(rng: np.random.Generator, items: tuple[str, ...] | list[str]) -> str:
    return items[int(rng.integers(len(items)))]


def html_response(text: str, status: int = 200) -> Any:
    from starlette.responses import HTMLResponse

    return HTMLResponse(text, status)


def redirect(url: str) -> Any:
    from starlette.responses import RedirectResponse

    return RedirectResponse(url, 303)


class SiteApp:
    """An arena site's ASGI app over a working database file: ``routes()`` lists its Starlette routes,
    ``header()`` is the navigation bar on every page."""

    def __init__(self, db: str | Path):
        from starlette.applications import Starlette

        self.db = Path(db)
        self.asgi = Starlette(routes=self.routes())

    def routes(self) -> list[Any]:
        raise NotImplementedError

    def header(self) -> str:
        return ""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.asgi(scope, receive, send)

    def _page(self, title: str, body: str, status: int = 200) -> Any:
        return html_response(layout(title, body, header=self.header()), status)

    def _listing(self, title: str, sql: str, item: Callable[[sqlite3.Row], str]) -> Any:
        """A page headed ``title`` listing the rows of ``sql``, each written by ``item`` as an ``<li>``."""
        with connect(self.db) as c:
            rows = c.execute(sql).fetchall()
        return self._page(title, f"<h1>{title}</h1><ul>{''.join(item(r) for r in rows)}</ul>")

    def _missing(self, what: str) -> Any:
        return self._page("Not found", f"<h1>404: {esc(what)} not found</h1>", 404)
