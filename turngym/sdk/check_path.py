"""``turngym check PATH``: load envs from a Python file or package directory, then check them.

A file or package may register envs (``turngym.register``) when imported, or just define
``Env`` subclasses; either way their ids (or instances) are returned for the conformance suite.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any

from turngym.core.registry import registry
from turngym.tools.env import Env


def load_envs_from_path(path: str | Path) -> list[str | Env]:
    """Import ``path``; return the env ids it registered, or else instances of the Env classes it defines."""
    path = Path(path).resolve()
    if not path.exists():
        raise FileNotFoundError(f"no such file or directory: {path}")
    before = set(registry)
    if path.is_dir():
        packages = [p.parent for p in sorted(path.glob("*/__init__.py"))]
        if (path / "__init__.py").exists():
            packages = [path]
        if not packages:
            raise ValueError(f"{path} holds no Python package")
        sys.path.insert(0, str(packages[0].parent))
        modules = [importlib.import_module(p.name) for p in packages]
        for mod in modules:  # a package's register() hook, as the entry point would call it
            hook = getattr(mod, "register", None)
            if callable(hook) and not set(registry) - before:
                hook()
    else:
        spec = importlib.util.spec_from_file_location(f"_turngym_check_{path.stem}", path)
        if spec is None or spec.loader is None:
            raise ValueError(f"cannot import {path}")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        modules = [mod]
    new_ids = sorted(set(registry) - before)
    if new_ids:
        return list(new_ids)
    found: list[str | Env] = []
    for mod in modules:
        for obj in _env_classes(mod):
            found.append(obj())
    if not found:
        raise ValueError(f"{path} registers no env and defines no Env subclass")
    return found


def _env_classes(mod: Any) -> list[type[Env]]:
    from turngym.sdk.tool_env import ToolEnv

    out = []
    for _, obj in inspect.getmembers(mod, inspect.isclass):
        if (
            issubclass(obj, Env)
            and obj not in (Env, ToolEnv)
            and obj.__module__ == mod.__name__
            and not inspect.isabstract(obj)
        ):
            out.append(obj)
    return out
