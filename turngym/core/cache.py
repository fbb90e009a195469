"""Where turngym keeps what it builds once: converted models, tiny test models, search worlds and
indexes, the travel database, the sites' SQLite files, SWE sdists.

:func:`cache_root` is the one place that decides it: an explicit folder, else ``$TURNGYM_CACHE_DIR``,
else ``$TURNGYM_CACHE`` (the older name, still honoured), else ``$XDG_CACHE_HOME/turngym``, else
``~/.cache/turngym``. Each family keeps its own subfolder (``models/``, ``tiny/``, ``search/``,
``travel/``, ``webshop/``, ``webarena/``, ``sdists/``); deleting any of them is safe (rebuilt on use).
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VARS = ("TURNGYM_CACHE_DIR", "TURNGYM_CACHE")  # first set wins


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The turngym cache folder (not created here): ``cache_dir`` if given, else the environment's."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    for var in ENV_VARS:
        if value := os.environ.get(var):
            return Path(value).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "turngym"
