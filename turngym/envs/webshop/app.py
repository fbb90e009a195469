"""The shop web app (Starlette): WebShop's pages over a generated catalog.

One server serves many episodes at once: each episode is a session, named by the
``shop_session`` cookie of its browser context (so URLs stay the same across episodes):

* ``/`` — the instruction and a search box;
* ``/search?q=..&page=N`` — BM25 results, 10 a page (at most 50 results, as in WebShop);
* ``/item/<asin>?q=..&page=N`` — title, price, rating, option radio buttons, a ``Buy Now``
  button and links to ``description`` / ``features`` / ``reviews`` sub-pages;
* ``POST /buy`` — records the purchase (asin and chosen options); the first purchase counts.

:class:`ShopApp` keeps the sessions in memory; the env opens a session per episode with
:meth:`ShopApp.open_session` and reads the purchase with :meth:`ShopApp.purchase`. A browser
without a session cookie (a person trying the site) gets a fresh session without instruction.
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from turngym.envs.browser.sites.server import LocalServer, esc, layout
from turngym.envs.webshop.catalog import Catalog, Product

COOKIE = "shop_session"
PAGE_SIZE = 10
MAX_RESULTS = 50
TABS = ("description", "features", "reviews")
_STYLE = (
    ".result{margin:10px 0;padding:6px;border-bottom:1px solid #ddd} .price{font-weight:bold}"
    " fieldset{border:1px solid #ccc;margin:8px 0} .instruction{background:#f3f3e0;padding:8px;margin-bottom:8px}"
)


@dataclass
class Purchase:
    asin: str
    options: dict[str, str]


@dataclass
class ShopSession:
    instruction: str
    purchase: Purchase | None = None
    pages: int = 0
    searches: list[str] = field(default_factory=list)


class ShopApp:
    """The ASGI app plus its session table (thread-safe)."""

    def __init__(self, catalog: Catalog, *, show_instruction: bool = True):
        from starlette.applications import Starlette
        from starlette.routing import Route

        self.catalog = catalog
        self.show_instruction = show_instruction
        self.sessions: dict[str, ShopSession] = {}
        self._lock = threading.Lock()
        self.asgi = Starlette(
            routes=[
                Route("/", self._index),
                Route("/search", self._search),
                Route("/item/{asin}", self._item),
                Route("/item/{asin}/{tab}", self._item_tab),
                Route("/buy", self._buy, methods=["POST"]),
            ]
        )

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.asgi(scope, receive, send)

    # ------------------------------------------------------------------ sessions
    def open_session(self, instruction: str) -> str:
        sid = secrets.token_hex(8)
        with self._lock:
            self.sessions[sid] = ShopSession(instruction)
        return sid

    def close_session(self, sid: str) -> None:
        with self._lock:
            self.sessions.pop(sid, None)

    def purchase(self, sid: str) -> Purchase | None:
        s = self.sessions.get(sid)
        return s.purchase if s else None

    # ------------------------------------------------------------------ pages
    def _page(self, sid: str, title: str, body: str) -> Any:
        from starlette.responses import HTMLResponse

        s = self.sessions[sid]
        s.pages += 1
        head = (
            f"<div class='instruction' id='instruction-text'>Instruction: {esc(s.instruction)}</div>"
            if self.show_instruction and s.instruction
            else ""
        )
        return HTMLResponse(layout(title, body, header=head, style=_STYLE))

    def _session(self, request: Any) -> str | Any:
        from starlette.responses import HTMLResponse

        sid = request.cookies.get(COOKIE, "")
        if sid not in self.sessions:
            return HTMLResponse(
                layout("No session", "<h1>This shopping session has ended.</h1><a href='/'>Start again</a>"),
                404,
            )
        return sid

    async def _index(self, request: Any) -> Any:
        sid = request.cookies.get(COOKIE, "")
        if sid not in self.sessions:  # a person without a session: open one
            sid = self.open_session("")
            response = self._page(sid, "WebShop", self._home_body())
            response.set_cookie(COOKIE, sid, httponly=True)
            return response
        return self._page(sid, "WebShop", self._home_body())

    def _home_body(self) -> str:
        return (
            "<h1>WebShop</h1>"
            "<form action='/search' method='get' role='search'>"
            "<input type='text' name='q' id='search_input' aria-label='Search' placeholder='Search products'>"
            "<button type='submit' id='search-button'>Search</button></form>"
        )

    def _search_box(self, sid: str, q: str) -> str:
        return (
            f"<form action='/search' method='get' role='search'>"
            f"<input type='text' name='q' aria-label='Search' value='{esc(q)}'>"
            "<button type='submit'>Search</button></form>"
        )

    async def _search(self, request: Any) -> Any:
        sid = self._session(request)
        if not isinstance(sid, str):
            return sid
        q = request.query_params.get("q", "").strip()
        page = _int(request.query_params.get("page"), 1)
        self.sessions[sid].searches.append(q)
        results = self.catalog.search(q, MAX_RESULTS) if q else []
        pages = max(1, -(-len(results) // PAGE_SIZE))
        page = min(max(page, 1), pages)
        shown = results[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]
        nav = ["<a href='/'>Back to Search</a>"]
        if page > 1:
            nav.append(f"<a href='/search?{urlencode({'q': q, 'page': page - 1})}'>&lt; Prev</a>")
        if page < pages:
            nav.append(f"<a href='/search?{urlencode({'q': q, 'page': page + 1})}'>Next &gt;</a>")
        rows = "".join(
            f"<div class='result'><a href='/item/{asin}?{urlencode({'q': q, 'page': page})}'>{esc(title)}</a>"
            f"<div class='muted'>{asin}</div><div class='price'>${price:.2f}</div></div>"
            for asin, title, price in shown
        )
        body = (
            self._search_box(sid, q)
            + f"<nav>{' '.join(nav)}</nav>"
            + f"<p>Page {page} (Total results: {len(results)})</p>"
            + (rows or "<p>No products match your search.</p>")
        )
        return self._page(sid, f"Search: {q}", body)

    def _product_or_404(self, sid: str, asin: str) -> Product | Any:
        from starlette.responses import HTMLResponse

        p = self.catalog.product(asin)
        if p is None:
            return HTMLResponse(layout("Not found", f"<h1>No product {esc(asin)}</h1>"), 404)
        return p

    def _item_request(self, request: Any) -> tuple[str, Product] | Any:
        """``(session id, product)`` of an item page's request, or the response that refuses it."""
        sid = self._session(request)
        if not isinstance(sid, str):
            return sid
        p = self._product_or_404(sid, request.path_params["asin"])
        return (sid, p) if isinstance(p, Product) else p

    async def _item(self, request: Any) -> Any:
        got = self._item_request(request)
        if not isinstance(got, tuple):
            return got
        sid, p = got
        back = _back_query(request)
        groups = []
        for name, values in p.options.items():
            radios = "".join(
                f"<input type='radio' name='opt_{esc(name)}' value='{esc(v)}' id='opt-{esc(name)}-{i}'>"
                f"<label for='opt-{esc(name)}-{i}'>{esc(v)}</label> "
                for i, v in enumerate(values)
            )
            groups.append(f"<fieldset><legend>{esc(name)}</legend>{radios}</fieldset>")
        tabs = " ".join(f"<a href='/item/{p.asin}/{t}?{back}'>{t.capitalize()}</a>" for t in TABS)
        body = (
            f"<nav><a href='/'>Back to Search</a> <a href='/search?{back}'>&lt; Prev</a></nav>"
            f"<h2>{esc(p.title)}</h2><div class='price'>Price: ${p.price:.2f}</div>"
            f"<div>Rating: {p.rating:.1f} out of 5 ({p.n_ratings} ratings)</div>"
            f"<form method='post' action='/buy'><input type='hidden' name='asin' value='{p.asin}'>"
            + "".join(groups)
            + "<button type='submit' id='buy-now'>Buy Now</button></form>"
            + f"<nav>{tabs}</nav>"
        )
        return self._page(sid, p.title, body)

    async def _item_tab(self, request: Any) -> Any:
        got = self._item_request(request)
        if not isinstance(got, tuple):
            return got
        sid, p = got
        tab = request.path_params["tab"]
        if tab == "description":
            content = f"<p>{esc(p.description)}</p>"
        elif tab == "features":
            content = "<ul>" + "".join(f"<li>{esc(b)}</li>" for b in p.bullets) + "</ul>"
        elif tab == "reviews":
            content = (
                "".join(
                    f"<div class='review'><b>{esc(r['title'])}</b> ({r['score']}/5)<p>{esc(r['body'])}</p></div>"
                    for r in p.reviews
                )
                or "<p>No reviews yet.</p>"
            )
        else:
            content = f"<p>Unknown section {esc(tab)}.</p>"
        back = _back_query(request)
        body = (
            f"<nav><a href='/'>Back to Search</a> <a href='/item/{p.asin}?{back}'>&lt; Prev</a></nav>"
            f"<h2>{esc(p.title)}: {esc(tab.capitalize())}</h2>{content}"
        )
        return self._page(sid, f"{p.title} - {tab}", body)

    async def _buy(self, request: Any) -> Any:
        sid = self._session(request)
        if not isinstance(sid, str):
            return sid
        form = await request.form()
        asin = str(form.get("asin", ""))
        p = self._product_or_404(sid, asin)
        if not isinstance(p, Product):
            return p
        options = {k[4:]: str(v) for k, v in form.items() if k.startswith("opt_")}
        s = self.sessions[sid]
        if s.purchase is None:
            s.purchase = Purchase(asin, options)
        chosen = ", ".join(f"{k}: {v}" for k, v in options.items()) or "no options chosen"
        body = (
            "<h1>Thank you for shopping with us!</h1>"
            f"<p>Your order of <b>{esc(p.title)}</b> ({esc(chosen)}) for ${p.price:.2f} has been placed.</p>"
        )
        return self._page(sid, "Order placed", body)


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


def _back_query(request: Any) -> str:
    return urlencode(
        {"q": request.query_params.get("q", ""), "page": _int(request.query_params.get("page"), 1)}
    )


def serve_shop(name: str = "shop", *, seed: int = 0, port: int | None = None) -> LocalServer:
    """The shop over the seeded catalog, started on ``port`` (the site registry's factory)."""
    from turngym.envs.webshop.catalog import Catalog, build_catalog

    return LocalServer(ShopApp(Catalog(build_catalog(seed))), name=name, port=port or 0).start()
