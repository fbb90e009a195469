"""DockerSandbox on the real Docker daemon: limits, timeouts, hostile commands, files, death, labels."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from turngym.sandboxes.docker import (
    LABEL_PID,
    LABEL_RUN_ID,
    DockerSandbox,
    SandboxDead,
    SandboxError,
    docker_client,
    managed_containers,
    reap_orphans,
)
from turngym.sandboxes.limits import Limits

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module")
def sb(base_image):
    box = DockerSandbox.create(
        base_image, limits=Limits(memory_mb=512, pids=128, disk_mb=64), run_id="t-sandbox"
    )
    yield box
    box.close()


def test_exec_returns_code_and_interleaved_output(sb):
    res = sb.exec("echo out; echo err >&2; exit 3")
    assert res.exit_code == 3 and not res.timed_out
    assert "out" in res.output and "err" in res.output


def test_timeout_kills_the_command_not_the_container(sb):
    t0 = time.perf_counter()
    res = sb.exec("echo start; sleep 30; echo never", timeout=1)
    assert res.timed_out and res.exit_code == 124
    assert "start" in res.output and "never" not in res.output
    assert time.perf_counter() - t0 < 10
    assert sb.exec("echo still here").output == "still here\n"


def test_background_process_that_escapes_the_group_cannot_hang_exec(sb):
    t0 = time.perf_counter()
    res = sb.exec("setsid sleep 300 & echo spawned", timeout=1)
    assert "spawned" in res.output
    assert time.perf_counter() - t0 < 15
    assert sb.exec("true").exit_code == 0


def test_huge_output_is_capped_with_a_marker(sb):
    res = sb.exec("yes abcdefgh | head -c 50000000; echo; echo TAIL", max_output_bytes=10_000)
    assert res.truncated and res.output_bytes > 50_000_000
    assert len(res.output) < 12_000
    assert "truncated" in res.output and res.output.rstrip().endswith("TAIL")


def test_binary_output_is_decoded_leniently(sb):
    res = sb.exec("head -c 4096 /dev/urandom; printf '\\x00\\xff'")
    assert res.exit_code == 0 and isinstance(res.output, str) and res.output_bytes == 4098


def test_fork_bomb_is_contained(sb):
    t0 = time.perf_counter()
    sb.exec("bomb() { bomb | bomb & }; bomb; sleep 2", timeout=4)
    assert time.perf_counter() - t0 < 20
    time.sleep(0.5)
    assert sb.exec("echo ok", timeout=20).output.strip() == "ok"
    assert int(sb.exec("ps -e --no-headers | wc -l").output) < 10  # nothing of the bomb is left


def test_background_jobs_end_with_their_command(sb):
    sb.exec("sleep 100 & echo started")
    assert "sleep 100" not in sb.exec("ps -eo args").output


def test_pid1_survives_kill_from_inside(sb):
    sb.exec("kill -9 1; kill -TERM 1; kill -INT 1; true")
    time.sleep(0.3)
    assert sb.alive()
    assert sb.exec("echo alive").output == "alive\n"


def test_disk_writes_are_bounded(sb):
    res = sb.exec("dd if=/dev/zero of=/tmp/big bs=1M count=2000 2>&1; df -m /tmp | tail -1", timeout=60)
    assert "No space left" in res.output
    sb.exec("rm -f /tmp/big")
    assert "Read-only" in sb.exec("touch /usr/x").output


def test_rm_rf_root_leaves_host_untouched(base_image, tmp_path):
    marker = tmp_path / "marker"
    marker.write_text("host")
    with DockerSandbox.create(base_image, run_id="t-sandbox") as box:
        box.exec("rm -rf --no-preserve-root / 2>/dev/null; true", timeout=30)
    assert marker.read_text() == "host"


def test_no_network(sb):
    res = sb.exec("cat /proc/net/dev | tail -n +3 | cut -d: -f1")
    assert res.output.split() == ["lo"]


def test_files_round_trip(sb):
    sb.put_files({"/testbed/a/b.txt": "hello\n", "/tmp/bin.dat": bytes(range(256))})
    assert sb.get_file("/testbed/a/b.txt") == b"hello\n"
    assert sb.get_file("/tmp/bin.dat") == bytes(range(256))
    with pytest.raises(SandboxError, match="no such file"):
        sb.get_file("/testbed/missing")
    with pytest.raises(SandboxError, match="limit"):
        sb.get_file("/tmp/bin.dat", max_bytes=10)
    with pytest.raises(SandboxError):
        sb.put_files({"relative/path": "x"})


def test_labels_name_the_owner(sb):
    labels = docker_client().containers.get(sb.id).labels
    assert labels[LABEL_PID] == str(os.getpid()) and labels[LABEL_RUN_ID] == "t-sandbox"


async def test_async_api(sb):
    res = await sb.aexec("echo async")
    assert res.output == "async\n" and await sb.aalive()


def test_container_killed_from_outside_is_reported(base_image):
    box = DockerSandbox.create(base_image, run_id="t-sandbox")
    try:
        docker_client().api.kill(box.id)
        with pytest.raises(SandboxDead):
            box.exec("echo hi")
        assert not box.alive()
    finally:
        box.close()
        box.close()  # idempotent
    assert box.closed
    with pytest.raises(SandboxDead):
        box.exec("echo hi")


def test_missing_image_is_a_clear_error():
    with pytest.raises(SandboxError, match="not found"):
        DockerSandbox.create("turngym-no-such-image:latest")


def test_sigkilled_driver_leaves_nothing_after_reaper(base_image):
    script = textwrap.dedent(
        f"""
        import time
        from turngym.sandboxes.docker import DockerSandbox
        sb = DockerSandbox.create({base_image!r}, run_id="t-orphan")
        print(sb.name, flush=True)
        time.sleep(600)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        name = proc.stdout.readline().strip()
        assert name.startswith("turngym-")
        assert [c.name for c in managed_containers(run_id="t-orphan")] == [name]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert name in reap_orphans()
    assert managed_containers(run_id="t-orphan") == []


@pytest.mark.parametrize("break_channel", [False, True])
def test_docker_exec_fallback_behaves_the_same(base_image, break_channel):
    """Without the PID-1 channel (disabled, or broken mid-life) commands go through ``docker exec``."""
    with DockerSandbox.create(base_image, run_id="t-sandbox", fast_exec=break_channel) as box:
        if break_channel:
            assert box.exec("true").exit_code == 0 and box.fast_exec
            box.channel._attach._sock.shutdown(socket.SHUT_RDWR)  # the attach stream dies under its feet
        assert box.exec("echo one; exit 4").exit_code == 4
        assert not box.fast_exec
        res = box.exec("sleep 30", timeout=1)
        assert res.timed_out and res.exit_code == 124
        assert box.exec("wc -c", stdin=b"12345").output.strip() == "5"
        res = box.exec("seq 1 200000", max_output_bytes=1000)
        assert res.truncated and res.output.rstrip().endswith("200000")
        box.exec("sleep 100 & echo bg")
        assert "sleep 100" not in box.exec("ps -eo args").output
