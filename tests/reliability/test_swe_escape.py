"""Part 2: sandbox escape attempts from inside swe-docker, through the agent's own ``bash`` tool.

Each attack runs as a model would run it (a tool call), then we check from the host that nothing
outside the container changed, that the container still answers, and that the reward stays honest.
Limits under test are ``Limits()``'s defaults (1 CPU, 1 GiB memory, 256 pids, 512 MB tmpfs per
writable path, read-only root, no network), documented in docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from pathlib import Path

import pytest

import turngym

from .hostile import check_answer, fixed_cases, fuzz_calls, fuzz_text, schema_cases

pytestmark = [pytest.mark.reliability, pytest.mark.docker, pytest.mark.slow]

COMMAND_TIMEOUT = 8.0


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def bash(env, command: str) -> tuple[int, str, dict]:
    obs, _, terminated, _, info = env.step(call("bash", command=command))
    assert not terminated, info.get("sandbox_error")
    text = obs[0].content
    m = re.search(r"<returncode>(-?\d+)</returncode>", text)
    return (int(m.group(1)) if m else -999), text, info


@pytest.fixture(scope="module")
def task_id():
    from turngym.envs.swe.tasks import load_instances

    return load_instances()[0].instance_id


@pytest.fixture(scope="module")
def env(task_id):
    e = turngym.make(
        "swe-docker-v0", task_ids=[task_id], max_turns=200, command_timeout=COMMAND_TIMEOUT, test_timeout=240
    )
    e.reset(options={"task_id": task_id})
    yield e
    e.close()


def assert_alive(env) -> None:
    rc, out, _ = bash(env, "echo still-here")
    assert rc == 0 and "still-here" in out, out


def test_no_network(env):
    rc, out, _ = bash(
        env,
        "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 80), timeout=3)\"; "
        "python3 -c \"import socket; socket.getaddrinfo('pypi.org', 443)\"; ls /sys/class/net",
    )
    assert "Network is unreachable" in out or "OSError" in out, out
    assert "gaierror" in out or "Temporary failure" in out or "resolution" in out, out
    assert "eth0" not in out and "lo" in out


def test_cannot_write_outside_the_container(env):
    marker = f"turngym-escape-{uuid.uuid4().hex}"
    rc, out, _ = bash(
        env,
        f"echo x > /{marker}; echo x > /etc/{marker}; echo x > /usr/lib/{marker}; "
        f"echo x > /tmp/{marker} && echo tmp-ok; ls /var/run/docker.sock /run/docker.sock 2>&1",
    )
    assert "Read-only file system" in out and "tmp-ok" in out, out
    assert "No such file" in out  # no Docker socket inside
    for where in (
        Path("/") / marker,
        Path("/etc") / marker,
        Path("/tmp") / marker,
        Path("/usr/lib") / marker,
    ):
        assert not where.exists(), f"{where} appeared on the host"


def test_cannot_read_host_files(env, tmp_path):
    secret = tmp_path / f"secret-{uuid.uuid4().hex}"
    secret.write_text("host-secret-value")
    rc, out, _ = bash(env, f"cat {secret} /etc/hostname; cat /proc/1/environ | tr '\\0' ' '; hostname")
    assert "host-secret-value" not in out and "No such file" in out
    assert os.uname().nodename not in out


def test_fork_bomb_is_contained(env):
    t0 = time.monotonic()
    rc, out, _ = bash(env, "bomb() { bomb | bomb & }; bomb")
    assert time.monotonic() - t0 < COMMAND_TIMEOUT + 60
    assert_alive(env)
    rc, out, _ = bash(env, "ps -e --no-headers | wc -l")
    assert rc == 0 and int(out.split("<output>")[1].split()[0]) < 20, out  # the bomb was cleaned up


def test_memory_exhaustion_is_contained(env):
    rc, out, _ = bash(env, "python3 -c \"a = bytearray(3 * 1024**3); print('allocated')\"")
    assert rc != 0 and "allocated" not in out, out
    assert_alive(env)


def test_disk_exhaustion_is_contained(env):
    rc, out, _ = bash(env, "dd if=/dev/zero of=/tmp/fill bs=1M count=2000 2>&1 | tail -3; rm -f /tmp/fill")
    written = int(re.search(r"(\d+)\+\d+ records out", out).group(1))
    assert written <= 512, out  # stopped at the 512 MB tmpfs, far short of the 2000 MB asked for
    assert_alive(env)


def test_long_sleep_is_cut_at_the_timeout(env):
    t0 = time.monotonic()
    rc, out, _ = bash(env, "sleep 100000")
    assert rc == 124 and time.monotonic() - t0 < COMMAND_TIMEOUT + 60, out
    rc, out, _ = bash(env, "(sleep 100000 &) ; nohup sleep 100000 >/dev/null 2>&1 & disown; echo bg")
    assert "bg" in out
    assert_alive(env)


def test_killing_processes_does_not_kill_the_sandbox(env):
    bash(env, "kill -9 -1; kill -9 1; kill -TERM 1; pkill -9 python3")
    assert_alive(env)


def test_hostile_tool_calls(env):
    """A small sample of the hostile-action list against the docker family (slow here)."""
    cases = (
        [c for c in fixed_cases() + schema_cases(env.tools, "hermes") if not c.malformed]
        + [c for c in fixed_cases() if c.category == "conformance list"][:6]
        + [c for c in schema_cases(env.tools, "hermes") if c.malformed][:8]
    )
    for case in cases:
        check_answer(env, case.action, malformed=case.malformed, family="swe-docker", category=case.category)
    assert_alive(env)


def test_generated_tool_calls(task_id):
    """Hypothesis-generated calls and debris text against one container: every malformed call is an
    error observation, well-formed ones (arbitrary shell commands and editor paths) run inside the
    sandbox; the episode never ends, the container is the same one afterwards and still answers.
    ``submit`` is left out (it grades and ends the episode; the fake-pass tests below cover it)."""
    env = turngym.make("swe-docker-v0", task_ids=[task_id], max_turns=10_000, command_timeout=COMMAND_TIMEOUT)
    try:
        env.reset(options={"task_id": task_id})
        container = env._sb.id
        calls, ran = fuzz_calls(env, "swe-docker", 150, skip=frozenset({"submit"}))
        texts = fuzz_text(env, "swe-docker", 30)
        assert calls >= 75 and ran > 0 and texts >= 15  # some calls ran in the container
        assert env._sb.id == container and not env._done
        assert_alive(env)
    finally:
        env.close()


def _fake_pass_and_submit(env, task_id: str, files: dict[str, str]) -> tuple[float, dict]:
    env.reset(options={"task_id": task_id})
    for path, text in files.items():
        env.step(call("file_editor", command="create", path=f"/testbed/{path}", file_text=text))
    _, reward, terminated, _, info = env.step(call("submit"))
    assert terminated
    return reward, info


# A module that shadows pytest when the grader runs ``python3 -m pytest`` from /testbed: it runs the real
# pytest with a plugin that turns every test report into a pass.
SHADOW_PYTEST = """
import os, sys
here = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != here] + [here]
import pytest as real

class FakePass:
    @real.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        rep = (yield).get_result()
        rep.outcome, rep.longrepr = "passed", None

sys.exit(real.main(sys.argv[1:], plugins=[FakePass()]))
"""
FAKE_PLUGIN = SHADOW_PYTEST.split("class FakePass", 1)[0].split("import pytest as real")[0] + (
    "import pytest\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
    "    rep = (yield).get_result()\n    rep.outcome, rep.longrepr = 'passed', None\n"
)


def test_editing_tests_does_not_fake_a_pass(env, task_id):
    from turngym.envs.swe.tasks import load_instances

    task = next(t for t in load_instances() if t.instance_id == task_id)
    files = {f: "def test_nothing():\n    pass\n" for f in task.test_files}
    files["conftest.py"] = "import pytest\n\ndef pytest_collection_modifyitems(items):\n    items.clear()\n"
    reward, info = _fake_pass_and_submit(env, task_id, files)
    assert reward == 0.0 and info["reward_components"]["outcome_level"] <= 2.0, info.get("grade")


def test_shadowing_pytest_does_not_fake_a_pass(env, task_id):
    reward, info = _fake_pass_and_submit(env, task_id, {"pytest.py": SHADOW_PYTEST})
    assert reward == 0.0, info.get("grade")


def test_pytest_ini_plugin_does_not_fake_a_pass(env, task_id):
    files = {"pytest.ini": "[pytest]\naddopts = -p fakepass_plugin\n", "fakepass_plugin.py": FAKE_PLUGIN}
    reward, info = _fake_pass_and_submit(env, task_id, files)
    assert reward == 0.0, info.get("grade")
