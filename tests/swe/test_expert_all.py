"""The scripted expert resolves every shipped task (validates image, seeding, editor, grading)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.slow]


async def test_expert_resolves_every_shipped_task(shipped_tasks):
    from turngym.envs.swe.validate import run_expert

    results = await run_expert(concurrency=2)
    assert len(results) == len(shipped_tasks) >= 60
    failed = {k: v for k, v in results.items() if v != 1.0}
    assert not failed, failed
