"""Entry-point plugins: one loader for every registry that third-party packages extend
(envs: ``turngym.envs``; credit methods: ``turngym.credit``), and the one resolver of the
``"package.module:name"`` references that configs and registrations name code by (env entry points
and judges, credit scorers and judges, harness reward functions, site servers)."""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
from typing import Any

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


def load_object(path: str, what: str, *, must_call: bool = False) -> Any:
    """The object ``"package.module:name"`` names (``name`` may be dotted: ``Class.attr``).

    ``what`` names the setting in the errors: a malformed reference, a missing name or (with
    ``must_call``) an object that is not callable raise ``ValueError``; a module that does not import
    raises its ``ImportError``."""
    module, sep, name = path.partition(":") if isinstance(path, str) else ("", "", "")
    if not sep or not module or not name:
        raise ValueError(f"{what} must be 'module:name', got {path!r}")
    obj: Any = importlib.import_module(module)
    for part in name.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{what} {path!r}: {module} has no {name}")
        obj = getattr(obj, part)
    if must_call and not callable(obj):
        raise ValueError(f"{what} {path!r} is not a callable")
    return obj
