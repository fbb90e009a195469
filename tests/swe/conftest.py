"""Fixtures of the swe-docker tests: the base image and a few shipped tasks (all built once, cached)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def base_image() -> str:
    from turngym.sandboxes.images import base_image as get_base

    return get_base()


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
