"""``web-shop``: WebShop's task and reward on a local shop, through the web-miniwob browser tools.

Each episode samples a goal from a target product of the generated catalog, opens a shop session
(a cookie in the episode's fresh browser context) and shows the shop's start page. The agent
searches, opens products, picks options and clicks ``Buy Now``; the purchase ends the episode and
pays WebShop's reward (see :mod:`~turngym.envs.webshop.reward`). No shortcuts: the tools are the
browser tools of ``web-miniwob`` plus navigation and tabs.

Goal splits follow WebShop's layout: goals ``0..499`` are ``test``, ``500..1499`` ``dev``, the rest
(up to ``n_goals``) ``train``. ``options={"goal_index": i}`` picks one goal. With WebShop's own
files, convert them once with :func:`~turngym.envs.webshop.loader.import_webshop` and pass
``catalog_path=`` and ``goals_path=`` (the human goals, split the same way).
"""

from __future__ import annotations

import copy
import threading
from pathlib import Path
from typing import Any, Literal

import numpy as np

from turngym.core.types import ToolResult
from turngym.envs.browser.env import Calls
from turngym.envs.browser.sites.env import Episode, SiteBrowserEnv
from turngym.envs.browser.sites.server import LocalServer
from turngym.envs.webshop.app import COOKIE, ShopApp
from turngym.envs.webshop.catalog import DEFAULT_SIZE, Catalog, build_catalog
from turngym.envs.webshop.expert import shop_expert_action
from turngym.envs.webshop.goals import Goal, goal_for_index
from turngym.envs.webshop.loader import load_goals
from turngym.envs.webshop.reward import webshop_reward

SHOP = "http://shop.local"
SPLITS = {"test": (0, 500), "dev": (500, 1500)}
_SHARED: dict[tuple[str, bool], tuple[ShopApp, LocalServer]] = {}
_SHARED_LOCK = threading.Lock()


def shared_shop(catalog_path: Path, show_instruction: bool = True) -> tuple[ShopApp, LocalServer]:
    """The process-wide shop server for a catalog (started on first use, restarted if it died)."""
    key = (str(catalog_path), show_instruction)
    with _SHARED_LOCK:
        if key not in _SHARED:
            app = ShopApp(Catalog(catalog_path), show_instruction=show_instruction)
            _SHARED[key] = (app, LocalServer(app, name="shop"))
        app, server = _SHARED[key]
        server.ensure()
        return app, server


class WebShopEnv(SiteBrowserEnv):
    """WebShop on a local shop.

    Args:
        split: ``"train"``, ``"dev"``, ``"test"`` or ``"all"`` goal indices.
        catalog_seed: seed of the generated catalog.
        catalog_size: number of products (default 12,000).
        catalog_path: an existing catalog file instead of the generated one.
        n_goals: size of the generated goal set (train goals are ``1500..n_goals-1``).
        goals_path: a goal list (JSON, as written by ``import_webshop``) instead of generated goals.
        show_instruction: also show the instruction on every page, as WebShop does.
        max_turns: default 15.
        **kwargs: :class:`~turngym.envs.browser.sites.env.SiteBrowserEnv` options.
    """

    default_max_turns = 15
    verdict_key = "purchase"
    # a fork shares the shop server and catalog (read-only) and opens a shop session of its own
    _fork_shared = (*SiteBrowserEnv._fork_shared, "app", "server", "catalog", "goal_list")
    _fork_fresh: dict[str, Any] = {**SiteBrowserEnv._fork_fresh, "sid": ""}
    system_intro = (
        "You are shopping on a web shop for the customer's instruction. Search, open products, choose the "
        "options the instruction asks for (colour, size, ...) and click 'Buy Now' on the best match: buying ends "
        'the episode. Each observation shows the URL and the page\'s elements as `[id] role "name"`; act on them '
        "by id with the tools."
    )

    def __init__(
        self,
        split: Literal["train", "dev", "test", "all"] = "train",
        *,
        catalog_seed: int = 0,
        catalog_size: int = DEFAULT_SIZE,
        catalog_path: str | Path | None = None,
        n_goals: int = 10_000,
        goals_path: str | Path | None = None,
        show_instruction: bool = True,
        **kwargs: Any,
    ):
        if split not in ("train", "dev", "test", "all"):
            raise ValueError(f"split must be train, dev, test or all; got {split!r}")
        self.split = split
        self.catalog_path = Path(catalog_path) if catalog_path else build_catalog(catalog_seed, catalog_size)
        self.goal_seed = catalog_seed
        self.goal_list = load_goals(goals_path) if goals_path else None
        if self.goal_list is not None:
            n_goals = len(self.goal_list)
        self.n_goals = n_goals
        lo, hi = SPLITS.get(split, (1500, n_goals) if split == "train" else (0, n_goals))
        hi = min(hi, n_goals)
        if hi <= lo:
            raise ValueError(f"n_goals={n_goals} leaves no goals in split {split!r}")
        self.goal_range = (lo, hi)
        self.show_instruction = show_instruction
        super().__init__(**kwargs)
        self.app, self.server = shared_shop(self.catalog_path, show_instruction)
        self.catalog = self.app.catalog
        self.sid = ""
        self.goal: Goal | None = None
        self.result: dict[str, Any] | None = None

    async def _start_episode(self, rng: np.random.Generator, options: dict[str, Any]) -> Episode:
        if self.sid:
            self.app.close_session(self.sid)
        lo, hi = self.goal_range
        index = int(options["goal_index"]) if "goal_index" in options else int(rng.integers(lo, hi))
        if not 0 <= index < self.n_goals:
            raise ValueError(f"goal_index {index} out of range 0..{self.n_goals - 1}")
        if self.goal_list is not None:
            goal = copy.deepcopy(self.goal_list[index])
        else:
            goal = goal_for_index(self.catalog, index, self.goal_seed)
        target = self.catalog.product(goal.asin)
        if target is None:
            raise ValueError(f"goal {index} names {goal.asin}, which is not in the catalog")
        goal.extra["goal_brand"] = target.brand
        self.goal, self.result = goal, None
        self.server.ensure()
        self.sid = self.app.open_session(goal.instruction_text)
        return Episode(
            instruction=goal.instruction_text,
            start_url=SHOP + "/",
            task_id=f"webshop/{index}",
            hosts={SHOP: self.server.url},
            reference={"goal": goal.to_dict(), "goal_index": index},
            info={"goal_index": index},
            cookies=[{"name": COOKIE, "value": self.sid, "url": self.server.url}],
        )

    async def _fork_sites(self) -> None:
        assert self.goal is not None and self.episode is not None
        self.server.ensure()
        self.sid = self.app.open_session(self.goal.instruction_text)
        self.episode.cookies = [{"name": COOKIE, "value": self.sid, "url": self.server.url}]
        self.episode.hosts = {SHOP: self.server.url}

    async def _episode_notes(self) -> list[str]:
        bought = self.app.purchase(self.sid)
        if bought is None or self.result is not None:
            return []
        product = self.catalog.product(bought.asin)
        assert product is not None and self.goal is not None
        reward, parts = webshop_reward(
            product, bought.options, self.goal, goal_brand=self.goal.extra["goal_brand"]
        )
        self.result = {"asin": bought.asin, "options": bought.options, "reward": reward, **parts}
        self.end_episode()
        await self._release()
        return ["You bought the product; the episode is over."]

    def _turn_reward(self, results: list[ToolResult], done: bool) -> dict[str, float]:
        if self.fault or self._paid:
            return {}
        if self.result is not None:
            self._paid = True
            return {"purchase": float(self.result["reward"])}
        return {"purchase": 0.0} if done else {}

    def _verdict(self) -> dict[str, Any] | None:
        return self.result

    def _expert_calls(self) -> Calls | None:
        if self._done or self.lease is None or self.goal is None or self.view is None:
            return None
        return shop_expert_action(self.goal, self.display_url(self.view.url), self.snap)

    async def _close(self) -> None:
        if self.sid:
            self.app.close_session(self.sid)
            self.sid = ""
        await super()._close()
