"""Fixtures of the swe-docker tests: a few shipped tasks (the base image is tests/conftest.py's)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def shipped_tasks():
    from turngym.envs.swe.tasks import load_instances

    return load_instances()


@pytest.fixture(scope="session")
def one_task_per_package(shipped_tasks):
    seen: dict[str, object] = {}
    for t in shipped_tasks:
        seen.setdefault(t.package, t)
    return list(seen.values())
