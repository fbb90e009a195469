"""``fork()`` of live site episodes (web-shop, web-arena-lite): the fork has site state of its own (a shop
session; site instances whose databases never receive the other branch's writes) and replays the prefix."""

from __future__ import annotations

import pytest

import turngym
from turngym.sandboxes.browser import BrowserPool

pytestmark = [pytest.mark.browser]


@pytest.fixture
def pool():
    p = BrowserPool(size=1)
    yield p
    assert p.stats.active == 0, "a lease (browser context) leaked"
    p.close()


def rows(instance) -> int:
    tables = [r[0] for r in instance.query("SELECT name FROM sqlite_master WHERE type = 'table'")]
    return sum(instance.query(f'SELECT count(*) FROM "{t}"')[0][0] for t in tables)


def finish(env) -> float:
    total = 0.0
    while not env.unwrapped._done:
        _, r, _, _, _ = env.step(env.expert_action())
        total += r
    return total


def test_shop_fork_has_its_own_session(pool):
    with turngym.make("web-shop-v0", split="test", catalog_size=300, n_goals=600, pool=pool) as env:
        env.reset(seed=1)
        for _ in range(2):
            env.step(env.expert_action())
        child = env.fork()
        assert child.sid != env.sid and child.server is env.server and child._state_key() == env._state_key()
        key = env._state_key()
        assert finish(child) == 1.0 and child.result is not None
        assert env._state_key() == key and env.result is None and env.app.purchase(env.sid) is None
        assert finish(env) == 1.0
        child.close()


def test_arena_fork_writes_never_reach_the_parents_database(pool):
    with turngym.make("web-arena-lite-v0", per_template=1, pool=pool) as env:
        env.reset(options={"task_id": 4})  # reply to a forum post: the last step writes a comment
        env.step(env.expert_action())
        child = env.fork()
        mine, theirs = env.instances["forum"], child.instances["forum"]
        assert theirs is not mine and theirs.db.path != mine.db.path and theirs.url != mine.url
        assert child._state_key() == env._state_key() and "127.0.0.1" not in child._state_key()
        before = rows(mine)
        assert rows(theirs) == before
        child.step(child.expert_action())
        grandchild = child.fork()  # a fork of a fork replays both prefixes on sites of its own
        assert grandchild._state_key() == child._state_key() and grandchild.instances["forum"] is not theirs
        assert finish(child) == 1.0
        assert rows(theirs) > before and rows(mine) == before  # the fork's reply is in its database only
        assert finish(grandchild) == 1.0 and rows(grandchild.instances["forum"]) == rows(theirs)
        assert finish(env) == 1.0 and rows(mine) == rows(theirs)
        child.close()
        grandchild.close()
        assert not theirs.server.alive
