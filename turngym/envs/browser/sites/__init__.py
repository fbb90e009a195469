"""Multi-page local sites for browser envs, and the registry of sites a person can serve.

Modules: :mod:`.env` (``SiteBrowserEnv``: element-id tools plus navigation and tabs), :mod:`.server`
(a Starlette/ASGI app on a free loopback port, and the page layout the sites share), :mod:`.storage`
(cached pristine SQLite files, restorable working copies).

The registry maps a site name to a string entry point ``"module:function"`` (nothing is imported
until a site is started): ``function(name, seed=..., port=...)`` returns a started
:class:`~turngym.envs.browser.sites.server.LocalServer`. The built-in sites are registered in
:mod:`turngym.envs.catalog`; a package adds its own with :func:`register_site`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from turngym.core.plugins import load_object


@dataclass(frozen=True)
class SiteEntry:
    name: str
    entry_point: str
    description: str = ""


_SITES: dict[str, SiteEntry] = {}


def register_site(name: str, entry_point: str, description: str = "") -> None:
    """Register a site server factory ``"module:function"`` under ``name`` (a new name, or the same
    entry point again)."""
    if ":" not in entry_point:
        raise ValueError(f"entry point must be 'module:function', got {entry_point!r}")
    old = _SITES.get(name)
    if old is not None and old.entry_point != entry_point:
        raise ValueError(f"site {name!r} is already registered ({old.entry_point})")
    _SITES[name] = SiteEntry(name, entry_point, description)


def site_names() -> list[str]:
    return sorted(_SITES)


def site_entry(name: str) -> SiteEntry:
    if name not in _SITES:
        raise ValueError(f"unknown site {name!r}; known: {', '.join(site_names()) or 'none'}")
    return _SITES[name]


def start_site(name: str, *, seed: int = 0, port: int | None = None) -> Any:
    """Start site ``name`` (its data from ``seed``) on ``port`` (a free one if None); returns the server."""
    serve = load_object(site_entry(name).entry_point, f"the entry point of site {name!r}", must_call=True)
    return serve(name, seed=seed, port=port)
