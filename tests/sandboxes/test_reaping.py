"""turngym.sandboxes.reaping: process ownership and the exit cleanup shared by sandboxes and browsers."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from turngym.sandboxes import reaping
from turngym.sandboxes.reaping import Owner


@pytest.fixture(autouse=True)
def _isolated_registry(monkeypatch):
    """Each test sees an empty registry and leaves the process's real one untouched."""
    monkeypatch.setattr(reaping, "_OBJECTS", {})
    monkeypatch.setattr(reaping, "_PROCESSES", {})


def _sleeper(*extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *extra])


class Closable:
    def __init__(self, log, name, fail=False):
        self.log, self.name, self.fail = log, name, fail

    def close(self):
        self.log.append(self.name)
        if self.fail:
            raise RuntimeError("boom")


def test_an_owned_child_process_is_killed_at_cleanup():
    proc = _sleeper()
    try:
        assert reaping.own_process(proc) == proc.pid
        assert reaping.owned() == ([], [proc.pid])
        reaping.cleanup()
        assert proc.wait(timeout=10) == -signal.SIGKILL
        assert reaping.owned() == ([], [])
    finally:
        proc.kill()


def test_the_whole_tree_of_an_owned_process_is_killed():
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        for _ in range(100):
            tree = reaping.process_tree(parent.pid)
            if len(tree) == 2:
                break
            time.sleep(0.05)
        assert len(tree) == 2
        child = tree[1]
        reaping.own_process(parent.pid)
        reaping.cleanup()
        assert parent.wait(timeout=10) == -signal.SIGKILL
        for _ in range(100):  # the orphaned child is killed too (its reaper may lag)
            if not reaping.pid_running(child):
                break
            time.sleep(0.05)
        assert not reaping.pid_running(child)
    finally:
        parent.kill()


def test_disowned_processes_survive_and_double_registration_is_one_entry():
    proc = _sleeper()
    try:
        reaping.own_process(proc)
        reaping.own_process(proc.pid)
        assert reaping.owned()[1] == [proc.pid]
        reaping.disown(proc)
        reaping.disown(proc)  # twice: harmless
        reaping.disown(proc.pid)
        reaping.disown(123456789)  # never owned: harmless
        reaping.cleanup()
        time.sleep(0.2)
        assert proc.poll() is None
    finally:
        proc.kill()


def test_a_reused_pid_is_not_killed():
    proc = _sleeper()
    try:
        reaping.own_process(proc)
        # pretend the owned process had another start time: the pid now belongs to someone else
        reaping._PROCESSES[proc.pid] = reaping._Process(proc.pid, "1")
        reaping.cleanup()
        time.sleep(0.2)
        assert proc.poll() is None
    finally:
        proc.kill()


def test_objects_close_newest_first_once_even_if_one_fails():
    log = []
    a, b, c = Closable(log, "a"), Closable(log, "b", fail=True), Closable(log, "c")
    assert reaping.own(a) is a
    reaping.own(b)
    reaping.own(c)
    reaping.own(a)  # again: still one entry, original position
    reaping.own(log, close=lambda: log.append("custom"))
    reaping.disown(c)
    reaping.disown(c)
    reaping.cleanup()
    assert log == ["custom", "b", "a"]
    reaping.cleanup()  # nothing left: nothing closes twice
    assert log == ["custom", "b", "a"]


def test_objects_close_before_processes_are_killed():
    proc = _sleeper()
    seen = []
    try:
        reaping.own_process(proc)

        class Pool:
            def close(self):  # a graceful close that finds its process still running
                seen.append(proc.poll())
                reaping.disown(proc)  # and releases it, as a pool that closed its browser does

        reaping.own(Pool())
        reaping.cleanup()
        assert seen == [None]
        time.sleep(0.2)
        assert proc.poll() is None  # disowned during close: not killed
    finally:
        proc.kill()


def test_owner_identity_uses_the_start_time():
    me = Owner.current()
    assert me.pid == os.getpid() and me.start and me.alive()
    assert Owner.from_token(me.token()) == me
    assert not Owner(me.host, me.pid, "1").alive()  # same pid, another process
    assert Owner(me.host, me.pid).alive()  # no start time: the pid alone
    assert not Owner(me.host, 999_999_999).alive() and not Owner.from_token("junk").alive()
    assert Owner("some-other-host", 999_999_999).alive()  # cannot be checked: assumed alive
    assert Owner.from_token("42").pid == 42 and Owner.from_token("42").start == ""


def test_start_once_runs_once_per_name():
    calls = []
    assert reaping.start_once("test-pass", lambda: calls.append(1))
    assert not reaping.start_once("test-pass", lambda: calls.append(2))
    for _ in range(100):
        if calls:
            break
        time.sleep(0.01)
    assert calls == [1]
    assert reaping.start_once("test-failing-pass", lambda: 1 / 0)  # errors are swallowed


def test_owned_processes_die_when_the_interpreter_exits(tmp_path):
    """The atexit hook: a child owned and never disowned does not outlive its owner."""
    pidfile = tmp_path / "pid"
    code = textwrap.dedent(
        f"""
        import subprocess, sys
        from turngym.sandboxes import reaping
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        reaping.own_process(p)
        open({str(pidfile)!r}, "w").write(str(p.pid))
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    pid = int(pidfile.read_text())
    for _ in range(100):
        if not reaping.pid_running(pid):
            break
        time.sleep(0.05)
    assert not reaping.pid_running(pid)
