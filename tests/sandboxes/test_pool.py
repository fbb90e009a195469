"""SandboxPool on the real daemon: warm hand-out, liveness check, replacement, bound, reset by removal."""

from __future__ import annotations

import pytest

from turngym.sandboxes.docker import SandboxError, docker_client, managed_containers
from turngym.sandboxes.pool import SandboxPool

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def test_warm_handout_and_release_removes_the_container(base_image):
    with SandboxPool(base_image, warm=1, max_active=2, run_id="t-pool") as pool:
        assert pool.wait_warm(60)
        sb = pool.acquire()
        assert pool.stats.handed_out_warm == 1 and sb.alive()
        sb.exec("touch /tmp/state")
        pool.release(sb)
        assert sb.closed
        fresh = pool.acquire()
        assert fresh.id != sb.id
        assert fresh.exec("test -e /tmp/state").exit_code == 1  # reset = a new container
        pool.release(fresh)


def test_dead_warm_container_is_replaced_not_handed_out(base_image):
    with SandboxPool(base_image, warm=1, max_active=2, run_id="t-pool") as pool:
        assert pool.wait_warm(60)
        victim = pool._idle[0]
        docker_client().api.kill(victim.id)
        sb = pool.acquire()
        try:
            assert sb.id != victim.id and sb.alive()
            assert pool.stats.replaced_dead == 1
            assert sb.exec("echo ok").output == "ok\n"
        finally:
            pool.release(sb)


def test_concurrency_is_bounded(base_image):
    with SandboxPool(base_image, warm=0, max_active=1, run_id="t-pool") as pool:
        sb = pool.acquire()
        with pytest.raises(SandboxError, match="no sandbox slot"):
            pool.acquire(timeout=0.5)
        pool.release(sb)
        with pool.sandbox(timeout=30) as again:
            assert again.alive()


async def test_async_handout(base_image):
    pool = SandboxPool(base_image, warm=1, max_active=2, run_id="t-pool")
    try:
        sb = await pool.aacquire()
        assert (await sb.aexec("echo hi")).output == "hi\n"
        await pool.arelease(sb)
    finally:
        await pool.aclose()


def test_shared_pool_closes_after_its_last_user(base_image):
    a = SandboxPool.shared(base_image, warm=1, max_active=2, run_id="t-pool-shared")
    b = SandboxPool.shared(base_image, warm=1, max_active=2, run_id="t-pool-shared")
    assert a is b
    a.wait_warm(60)
    a.detach()
    assert not b.closed
    b.detach()
    assert b.closed and b.idle == 0


def test_prepare_runs_before_hand_out_and_failures_are_not_handed_out(base_image):
    def stage(sb):
        sb.put_files({"/tmp/staged.txt": "ready"})

    with SandboxPool(base_image, warm=1, max_active=2, run_id="t-pool", prepare=stage) as pool:
        assert pool.wait_warm(60)
        with pool.sandbox() as sb:
            assert sb.get_file("/tmp/staged.txt") == b"ready"

    def broken(sb):
        raise RuntimeError("staging failed")

    with SandboxPool(base_image, warm=0, max_active=2, run_id="t-pool", prepare=broken) as pool:
        with pytest.raises(RuntimeError, match="staging failed"):
            pool.acquire()
        assert pool._slots._value == 2  # the slot was given back
    assert managed_containers(run_id="t-pool") == []
