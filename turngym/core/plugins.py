"""Entry-point plugins: one loader for every registry that third-party packages extend
(envs: ``turngym.envs``; credit methods: ``turngym.credit``)."""

from __future__ import annotations

import importlib.metadata
import logging

log = logging.getLogger("turngym.plugins")


def load_entry_points(group: str, errors: dict[str, str]) -> None:
    """Load every entry point of ``group``; one that names a callable (not a class) is called once.

    A plugin that fails is recorded in ``errors`` (name -> one line) and logged, never raised: a
    broken third-party package must not break turngym.
    """
    for ep in importlib.metadata.entry_points(group=group):
        try:
            obj = ep.load()
            if callable(obj) and not isinstance(obj, type):
                obj()
        except Exception as e:  # noqa: BLE001 - see the docstring
            errors[ep.name] = f"{type(e).__name__}: {e}"
            log.warning("%s plugin %s failed to load: %s", group, ep.name, errors[ep.name])
