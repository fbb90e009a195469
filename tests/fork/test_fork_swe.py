"""Forking swe-docker on the real daemon: the fork's container holds the parent's files at the fork point,
branches never touch each other (files, git state, grades), the pool's limit is a ``ForkError``, and
crashed / closed / busy parents are clear errors; nothing (container or image) is left behind."""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import turngym
from turngym.core.env import ForkError
from turngym.sandboxes.docker import LABEL_PID, docker_client, managed_containers

pytestmark = [pytest.mark.docker]


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def out(env, command: str) -> str:
    obs, *_ = env.step(call("bash", command=command))
    return obs[0].content


def mine() -> set[str]:
    """This process's containers (other engineers share the daemon)."""
    return {c.name for c in managed_containers() if c.labels.get(LABEL_PID) == str(os.getpid())}


def images() -> set[str]:
    return {i.id for i in docker_client().images.list(all=True)}


@pytest.fixture(scope="module")
def task():
    from turngym.envs.swe.tasks import load_instances

    return load_instances()[0]


@pytest.fixture(scope="module")
def leak_check():
    """Containers and images of this process before the module; after it, everything it made is gone."""
    from turngym.sandboxes.images import base_image

    base_image()  # built (or found) before the baseline
    before_c, before_i = mine(), images()
    yield
    deadline = time.monotonic() + 60
    while mine() - before_c and time.monotonic() < deadline:  # releases run in the background
        time.sleep(0.2)
    assert mine() - before_c == set(), "fork tests leaked containers"
    assert images() - before_i == set(), "fork tests left images behind"


def make(task, **kw):
    return turngym.make(
        "swe-docker-v0", task_ids=[task.instance_id], max_turns=12, command_timeout=20, pool_warm=0, **kw
    )


def test_branches_are_independent_and_both_graded(task, leak_check):
    env = make(task)
    env.reset(seed=0)
    env.step(call("file_editor", command="create", path="/testbed/notes.txt", file_text="parent\n"))
    src = task.expert_edits[0]["path"]
    out(
        env, f"git add notes.txt && echo scratch > other.txt && echo '# parent' >> {src}"
    )  # staged in git's index, and untracked
    status = out(env, f"git status --porcelain; md5sum notes.txt other.txt {src}; git rev-parse HEAD")
    assert "A  notes.txt" in status and "?? other.txt" in status
    child = env.fork()
    assert (
        child.turn == env.turn == 3
        and child._state_key() == env._state_key()
        and child.task.task_id == env.task.task_id
    )
    assert child._sb is not env._sb and child._sb.name != env._sb.name
    assert child._pools is not env._pools and child._staged is not env._staged and child.tasks is env.tasks
    assert child._history == env._history and child._history is not env._history
    assert child.np_random.bit_generator.state == env.np_random.bit_generator.state
    assert child.task.info["container"] == child._sb.name != env.task.info["container"]
    # the fork sees the parent's files and git state (index included) at the fork point
    assert (
        out(child, f"git status --porcelain; md5sum notes.txt other.txt {src}; git rev-parse HEAD") == status
    )
    # the fork undoes the parent's editor edit (its history was copied), deletes a file and fixes the bug
    obs, *_ = child.step(call("file_editor", command="undo_edit", path="/testbed/notes.txt"))
    assert "undone" in obs[0].content
    out(child, "rm other.txt; echo fork > fork-only.txt")
    while not child._done:
        _, reward_fork, terminated, _, info_fork = child.step(child.expert_action())
    assert terminated and reward_fork == 1.0, info_fork.get("grade")
    # the parent never saw any of it; its grade is its own (a patch that fixes nothing)
    assert out(env, f"git status --porcelain; md5sum notes.txt other.txt {src}; git rev-parse HEAD") == status
    assert "No such file" in out(env, "ls fork-only.txt")
    assert env._edited and "/testbed/notes.txt" in env._history
    _, reward, terminated, _, info = env.step(call("submit"))
    assert terminated and reward == 0.0
    assert info["reward_components"]["outcome_level"] == 2.0 and info["grade"]["applied"]
    child.close()
    env.close()


def test_the_pool_limit_is_a_fork_error_and_a_closed_fork_frees_its_slot(task, leak_check):
    env = make(task, max_active=2)
    env.reset(seed=0)
    out(env, "echo kept > kept.txt")
    first = env.fork()
    with pytest.raises(ForkError, match="no container slot"):
        env.fork()
    with pytest.raises(ForkError, match="no container slot"):
        first.fork()
    assert out(env, "cat kept.txt").count("kept") == 1  # the parent carries on
    first.close()
    deadline = time.monotonic() + 30  # the slot frees once the container is removed (background)
    while True:
        try:
            second = env.fork()
            break
        except ForkError:
            assert time.monotonic() < deadline, "closing the fork did not free its slot"
            time.sleep(0.2)
    assert "kept" in out(second, "cat kept.txt")
    second.close()
    env.close()


def test_crashed_closed_and_busy_parents_are_fork_errors(task, leak_check):
    env = make(task)
    with pytest.raises(ForkError, match="never reset"):
        env.fork()
    env.reset(seed=0)
    out(env, "echo a > a.txt")

    async def fork_during_step():
        step = asyncio.create_task(env.astep(call("bash", command="sleep 1; echo slept")))
        await asyncio.sleep(0.3)
        with pytest.raises(ForkError, match="middle of a step"):
            await env.afork()
        obs, *_ = await step
        assert "slept" in obs[0].content
        child = await env.afork()  # the async form, once the step is over
        assert "a" in (await child.astep(call("bash", command="cat a.txt")))[0][0].content
        await child.aclose()

    env._run(fork_during_step())
    docker_client().api.kill(env._sb.id)  # the container dies mid-episode
    with pytest.raises(ForkError, match="not running"):
        env.fork()
    _, reward, terminated, _, info = env.step(call("bash", command="echo hi"))
    assert terminated and reward == 0.0 and info["masked"]  # the parent reports its own fault as before
    with pytest.raises(ForkError, match="container died"):
        env.fork()
    env.close()
    with pytest.raises(ForkError, match="closed"):
        env.fork()


def test_a_writable_root_is_not_forkable(task):
    from turngym.core.env import NotForkable
    from turngym.sandboxes.limits import Limits

    env = make(task, limits=Limits(read_only=False))
    assert not env.forkable
    env.reset(seed=0)
    with pytest.raises(NotForkable, match="read_only"):
        env.fork()
    env.close()


@pytest.mark.slow
def test_conformance_fork_row(task, leak_check):
    from turngym.testing import check_env

    report = check_env("swe-docker-v0", task_ids=[task.instance_id], max_turns=3, seeds=(0,))
    fork = next(r for r in report.results if r.name == "fork")
    assert fork.passed and "matched a fresh replay" in fork.detail, fork.detail


# ------------------------------------------------------------------ the sandbox's snapshot / restore
_NAME = st.text(alphabet="abcXYZ019 _-.é", min_size=1, max_size=12).filter(lambda s: s not in (".", ".."))


@pytest.fixture(scope="module")
def two_sandboxes(leak_check):
    from turngym.sandboxes.docker import DockerSandbox
    from turngym.sandboxes.images import base_image

    a = DockerSandbox.create(base_image(), workdir="/testbed")
    b = DockerSandbox.create(base_image(), workdir="/testbed")
    yield a, b
    a.close()
    b.close()


LISTING = (
    "cd / && find testbed tmp root -mindepth 1 -printf '%p %y %m %s %l\\n' | LC_ALL=C sort && "
    "find testbed tmp root -type f -print0 | LC_ALL=C sort -z | xargs -0r md5sum"
)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    files=st.dictionaries(
        st.lists(_NAME, min_size=1, max_size=3).map("/".join), st.binary(max_size=3000), max_size=6
    ),
    executable=st.booleans(),
)
def test_restore_reproduces_any_tree_of_the_writable_mounts(two_sandboxes, files, executable):
    a, b = two_sandboxes
    paths = ["/testbed", "/tmp", "/root"]
    for sb in (a, b):  # start from different trees: the restore must remove what b had
        sb.exec("rm -rf /testbed/* /testbed/.[!.]* /tmp/* /root/* 2>/dev/null; true")
    b.put_files({"/testbed/stale/old.py": "stale", "/root/.cache": "x"})
    tree = {}
    for rel, data in files.items():
        if any(other.startswith(rel + "/") for other in files):  # a name that is also a directory
            continue
        tree[f"/testbed/{rel}"] = data
    a.put_files(tree)
    a.exec(
        "mkdir -p /tmp/empty/dir && ln -sf /testbed/nowhere /root/link"
        + (" && chmod 755 /testbed/*" if executable else "")
    )
    before = a.exec(LISTING).output
    archive = a.snapshot(paths, max_bytes=64 << 20)
    b.restore(paths, archive)
    assert b.exec(LISTING).output == before
    assert a.exec(LISTING).output == before  # the snapshot changed nothing in a


def test_a_snapshot_over_its_limit_is_an_error_not_a_cut_archive(two_sandboxes):
    from turngym.sandboxes.docker import SandboxDead, SandboxError

    a, _ = two_sandboxes
    a.exec("head -c 200000 /dev/urandom > /testbed/big.bin")
    with pytest.raises(SandboxError, match="over 100000 bytes"):
        a.snapshot(["/testbed"], max_bytes=100_000)
    with pytest.raises(SandboxError, match="absolute"):
        a.snapshot(["testbed"], max_bytes=1 << 20)
    with pytest.raises(SandboxError, match="unpacking"):
        a.restore(["/testbed"], b"not a tar archive")
    assert a.exec("ls /testbed").exit_code == 0  # still usable
    from turngym.sandboxes.docker import DockerSandbox
    from turngym.sandboxes.images import base_image

    gone = DockerSandbox.create(base_image())
    docker_client().api.kill(gone.id)
    with pytest.raises(SandboxDead):
        gone.snapshot(["/testbed"], max_bytes=1 << 20)
    gone.close()
