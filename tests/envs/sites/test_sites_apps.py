"""The shop, forum and tracker web apps over HTTP (real uvicorn servers, no browser)."""

from __future__ import annotations

import re

import httpx
import pytest

from turngym.envs.browser.sites.server import LocalServer, ServerError
from turngym.envs.webarena.sites import SiteInstance, pristine_db
from turngym.envs.webshop.app import COOKIE, MAX_RESULTS, ShopApp

pytestmark = pytest.mark.slow  # real uvicorn servers


@pytest.fixture(scope="module")
def shop(small_catalog):
    app = ShopApp(small_catalog)
    with LocalServer(app, name="shop") as server:
        yield app, server


def _client(server, sid=None):
    cookies = {COOKIE: sid} if sid else None
    return httpx.Client(base_url=server.url, cookies=cookies, follow_redirects=True, timeout=10)


def test_shop_search_item_buy(shop, small_catalog):
    app, server = shop
    sid = app.open_session("buy something nice")
    c = _client(server, sid)
    home = c.get("/")
    assert home.status_code == 200 and "buy something nice" in home.text
    target = small_catalog.product_at(3)
    r = c.get("/search", params={"q": target.title})
    assert r.status_code == 200 and "Total results" in r.text and target.asin in r.text
    assert len(re.findall(r"class='result'", r.text)) == 10
    item = c.get(f"/item/{target.asin}", params={"q": target.title, "page": 1})
    assert target.title.replace("'", "&#x27;") in item.text and f"${target.price:.2f}" in item.text
    for name, values in target.options.items():
        for v in values:
            assert f"name='opt_{name}' value='{v}'" in item.text
    for tab in ("description", "features", "reviews"):
        assert c.get(f"/item/{target.asin}/{tab}").status_code == 200
    assert app.purchase(sid) is None
    name, values = next(iter(target.options.items()))
    done = c.post("/buy", data={"asin": target.asin, f"opt_{name}": values[0]})
    assert done.status_code == 200 and "Thank you" in done.text
    bought = app.purchase(sid)
    assert bought is not None and bought.asin == target.asin and bought.options == {name: values[0]}
    c.post("/buy", data={"asin": small_catalog.product_at(4).asin})  # the first purchase counts
    assert app.purchase(sid).asin == target.asin
    app.close_session(sid)
    assert c.get("/search", params={"q": "x"}).status_code == 404


def test_shop_paging_and_bad_input(shop):
    app, server = shop
    sid = app.open_session("")
    c = _client(server, sid)
    pages = [c.get("/search", params={"q": "shirt coffee lamp", "page": p}).text for p in (1, 2, 5, 99, "x")]
    assert f"Total results: {MAX_RESULTS}" in pages[0]
    assert "Page 2 " in pages[1] and "Page 5 " in pages[2] and "Page 5 " in pages[3] and "Page 1 " in pages[4]
    assert "Next &gt;" in pages[0] and "Next &gt;" not in pages[2]
    assert c.get("/item/NOPE").status_code == 404
    assert c.post("/buy", data={"asin": "NOPE"}).status_code == 404
    assert app.purchase(sid) is None
    assert "No products match" in c.get("/search", params={"q": "zzzzqqq"}).text


def test_shop_without_session_opens_one(shop):
    app, server = shop
    with httpx.Client(base_url=server.url) as c:
        assert c.get("/").status_code == 200
        assert c.cookies.get(COOKIE) in app.sessions


def test_server_lifecycle(small_catalog):
    server = LocalServer(ShopApp(small_catalog), name="t").start()
    url = server.url
    assert server.alive and httpx.get(url + "/").status_code == 200
    server.stop()
    server.stop()
    assert not server.alive
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/", timeout=2)
    server.ensure()
    assert server.alive and httpx.get(server.url + "/").status_code == 200
    server.stop()
    with pytest.raises(ServerError):
        LocalServer(object(), name="x").url  # noqa: B018 - not started


@pytest.fixture(scope="module")
def forum(site_dir):
    inst = SiteInstance("forum", seed=0, data_dir=site_dir)
    yield inst
    inst.close()


@pytest.fixture(scope="module")
def tracker(site_dir):
    inst = SiteInstance("tracker", seed=0, data_dir=site_dir)
    yield inst
    inst.close()


def test_forum_pages_and_actions(forum):
    c = httpx.Client(base_url=forum.url, follow_redirects=True)
    assert "f/books" in c.get("/").text
    listing = c.get("/f/books?sort=top").text
    scores = [int(s) for s in re.findall(r"class='score'>(-?\d+) points", listing)]
    assert scores == sorted(scores, reverse=True) and len(scores) == 50
    pid, title = forum.query("SELECT id, title FROM posts WHERE forum = 'books' LIMIT 1")[0]
    n_before = forum.query(f"SELECT count(*) FROM comments WHERE post_id = {pid}")[0][0]
    assert f"{n_before} comments" in c.get(f"/f/books/{pid}").text
    assert "you upvoted" in c.post(f"/f/books/{pid}/vote", data={"value": "1"}).text
    assert forum.query(f"SELECT value FROM votes WHERE post_id = {pid}") == [(1,)]
    assert "you upvoted" not in c.post(f"/f/books/{pid}/vote", data={"value": "1"}).text  # toggled off
    assert "a fine reply" in c.post(f"/f/books/{pid}/comment", data={"body": "a fine reply"}).text
    r = c.post("/submit", data={"forum": "music", "title": "New here", "body": "hi"})
    assert r.url.path.startswith("/f/music/") and "New here" in r.text
    assert "The title is required" in c.post("/submit", data={"forum": "music", "title": ""}).text
    assert "Unsubscribe" in c.post("/f/music/subscribe").text
    assert c.get("/f/nope").status_code == 404 and c.get("/f/books/999999").status_code == 404
    assert c.get("/u/nobody").status_code == 404
    assert title in c.get("/search", params={"q": title}).text


def test_tracker_pages_and_actions(tracker):
    c = httpx.Client(base_url=tracker.url, follow_redirects=True)
    n_open = tracker.query("SELECT count(*) FROM issues WHERE project='payments-api' AND state='opened'")[0][
        0
    ]
    assert f"{n_open} issues" in c.get("/payments-api/-/issues").text
    n_bug = tracker.query(
        "SELECT count(*) FROM issue_labels l JOIN issues i USING (project, iid) "
        "WHERE l.project='payments-api' AND l.label='bug'"
    )[0][0]
    assert f"{n_bug} issues" in c.get("/payments-api/-/issues?state=all&label_name=bug").text
    c.post("/payments-api/-/issues/1/toggle")
    c.post("/payments-api/-/issues/1/assign", data={"assignee": "byte_blaze"})
    c.post("/payments-api/-/issues/1/label", data={"label": "security"})
    c.post("/payments-api/-/issues/1/label", data={"label": "not-a-label"})
    page = c.post("/payments-api/-/issues/1/comment", data={"body": "on it"}).text
    assert "Assignee: byte_blaze" in page and "security" in page and "on it" in page
    assert "not-a-label" not in page
    r = c.post("/payments-api/-/issues/new", data={"title": "Brand new", "description": "d"})
    assert r.url.path == "/payments-api/-/issues/61" and "Brand new" in r.text
    assert "The title is required" in c.post("/payments-api/-/issues/new", data={"title": " "}).text
    assert (
        c.get("/nope/-/issues").status_code == 404 and c.get("/payments-api/-/issues/999").status_code == 404
    )


def test_reset_restores_the_pristine_database(site_dir):
    inst = SiteInstance("tracker", seed=0, data_dir=site_dir)
    try:
        before = inst.query("SELECT project, iid, state, assignee FROM issues ORDER BY project, iid")
        c = httpx.Client(base_url=inst.url, follow_redirects=True)
        c.post("/payments-api/-/issues/2/toggle")
        c.post("/payments-api/-/issues/new", data={"title": "x"})
        assert inst.query("SELECT project, iid, state, assignee FROM issues ORDER BY project, iid") != before
        seconds = inst.reset()
        assert seconds >= 0
        assert inst.query("SELECT project, iid, state, assignee FROM issues ORDER BY project, iid") == before
        assert c.get("/payments-api/-/issues/61").status_code == 404  # the server reads the restored file
        inst.server.stop()  # a dead server comes back on reset
        inst.reset()
        assert httpx.get(inst.url + "/").status_code == 200
    finally:
        inst.close()


def test_site_data_is_deterministic(tmp_path, site_dir):
    a = pristine_db("forum", 4, directory=tmp_path)
    b = pristine_db("forum", 4, directory=tmp_path / "other")
    assert a.read_bytes() == b.read_bytes()
    assert pristine_db("forum", 0, directory=site_dir).read_bytes() != a.read_bytes()
    with pytest.raises(ValueError, match="unknown site"):
        SiteInstance("shopping_admin")
