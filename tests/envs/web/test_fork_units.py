"""The browser fork's bookkeeping without a browser: the page log and the URL mapping of site replays."""

from __future__ import annotations

import copy
import string

from hypothesis import given
from hypothesis import strategies as st

from turngym.envs.browser.element_tools import _click, _fill
from turngym.envs.browser.fork import PageLog, PageOp, diverged
from turngym.envs.browser.sites.env import SiteBrowserEnv


def test_page_log_groups_calls_by_turn_and_copies_independently():
    log = PageLog()
    log.start("k0")
    log.record(PageOp(_fill, (3, "hello"), None, True))
    log.record(PageOp(_click, (9, "left", 1, True), None, False))
    log.end_turn("k1")
    log.end_turn("k2")  # a turn without page calls (a parse error) still has its observation
    assert log.keys == ["k0", "k1", "k2"] and [len(t) for t in log.turns] == [2, 0]
    assert log.turns[0][1].describe() == "_click(9, 'left', 1, True)" and not log.turns[0][1].ok
    twin = copy.deepcopy(log)
    twin.record(PageOp(_fill, (4, "x"), None, True))
    twin.end_turn("k3")
    assert log.keys == ["k0", "k1", "k2"] and len(log.turns) == 2 and len(twin.turns) == 3
    assert twin.turns[0] is not log.turns[0] and twin.turns[0] == log.turns[0]
    log.start("new episode")
    assert log.keys == ["new episode"] and log.turns == [] and twin.keys[0] == "k0"


def test_divergence_error_names_where_and_why():
    e = diverged("at turn 2", "abc", "xyz")
    assert "replay diverged at turn 2" in str(e) and "abc" in str(e) and "xyz" in str(e)
    assert "not deterministic" in str(e)


PATHS = st.text(alphabet=string.ascii_letters + string.digits + "/?=&-_.%", max_size=40)


@given(PATHS, st.integers(0, 9))
def test_logged_urls_replay_on_the_forks_own_sites(path, digit):
    parent = SiteBrowserEnv.__new__(SiteBrowserEnv)
    parent.hosts = {"http://forum.local": "http://127.0.0.1:4000"}
    fork = SiteBrowserEnv.__new__(SiteBrowserEnv)
    fork.hosts = {"http://forum.local": "http://127.0.0.1:5555"}
    for url in ("http://127.0.0.1:4000", "http://127.0.0.1:4000/" + path, "http://127.0.0.1:4000?" + path):
        logged = parent._log_args((url, 15.0))
        assert logged == ("http://forum.local" + url[len("http://127.0.0.1:4000") :], 15.0)
        assert fork._replay_args(logged) == (
            "http://127.0.0.1:5555" + url[len("http://127.0.0.1:4000") :],
            15.0,
        )
    lookalike = f"http://127.0.0.1:4000{digit}/{path}"  # another port that starts with the same digits
    assert fork._replay_args(parent._log_args((lookalike,))) == (lookalike,)
    other = "http://shop.local/" + path  # not one of this task's sites: left alone
    assert fork._replay_args(parent._log_args((other, None, 3))) == (other, None, 3)
