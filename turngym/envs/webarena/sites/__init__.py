"""The arena-style sites: their specs (name, virtual origin, data builder, app) and running instances.

A :class:`SiteInstance` is one running copy of a site: a private working copy of the site's
pristine database (generated once from a seed and cached), the site's Starlette app over that
copy, and a :class:`~turngym.envs.browser.sites.server.LocalServer` on a free loopback port.
:meth:`SiteInstance.reset` restores the database file (milliseconds).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turngym.core.cache import cache_root
from turngym.envs.browser.sites.server import LocalServer
from turngym.envs.browser.sites.storage import WorkingCopy, build_cached, connect
from turngym.envs.webarena.sites import forum, tracker


@dataclass(frozen=True)
class SiteSpec:
    name: str
    origin: str  # the virtual origin agents see
    placeholders: tuple[str, ...]  # URL placeholders in task files (ours, then WebArena's)
    version: int
    build: Callable[[sqlite3.Connection, int], None]
    app: Callable[[Path], Any]


SITES: dict[str, SiteSpec] = {
    "forum": SiteSpec(
        "forum", "http://forum.local", ("__FORUM__", "__REDDIT__"), forum.VERSION, forum.build, forum.ForumApp
    ),
    "tracker": SiteSpec(
        "tracker",
        "http://tracker.local",
        ("__TRACKER__", "__GITLAB__"),
        tracker.VERSION,
        tracker.build,
        tracker.TrackerApp,
    ),
}
#: WebArena's site names -> ours
SITE_ALIASES = {"reddit": "forum", "gitlab": "tracker", "forum": "forum", "tracker": "tracker"}


def pristine_db(site: str, seed: int = 0, *, directory: str | Path | None = None) -> Path:
    """The cached pristine database of ``site`` for ``seed`` (generated on first use)."""
    spec = SITES[site]
    root = Path(directory) if directory is not None else cache_root() / "webarena"
    return build_cached(root / f"{site}-v{spec.version}-s{seed}.sqlite", lambda conn: spec.build(conn, seed))


class SiteInstance:
    """One running, resettable copy of a site."""

    def __init__(self, site: str, seed: int = 0, *, data_dir: str | Path | None = None):
        if site not in SITES:
            raise ValueError(f"unknown site {site!r}; known: {sorted(SITES)}")
        self.spec = SITES[site]
        t0 = time.perf_counter()
        self.db = WorkingCopy(pristine_db(site, seed, directory=data_dir))
        self.server = LocalServer(self.spec.app(self.db.path), name=site).start()
        self.start_s = time.perf_counter() - t0

    @property
    def url(self) -> str:
        return self.server.url

    def reset(self) -> float:
        """Restore the pristine database (and restart the server if it died); returns seconds."""
        self.server.ensure()
        return self.db.restore()

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        """Run a read-only SQL query against the live database."""
        with connect(self.db.path, readonly=True) as conn:
            return [tuple(r) for r in conn.execute(sql).fetchall()]

    def close(self) -> None:
        self.server.stop()
        self.db.cleanup()


def serve_site(name: str, *, seed: int = 0, port: int | None = None) -> LocalServer:
    """Site ``name`` over a fresh working copy of its seeded database, started on ``port`` (the site
    registry's factory; the working copy is for a person browsing, restored on the next start)."""
    if name not in SITES:
        raise ValueError(f"unknown site {name!r}; known: {sorted(SITES)}")
    db = WorkingCopy(pristine_db(name, seed))
    return LocalServer(SITES[name].app(db.path), name=name, port=port or 0, owns=(db,)).start()
