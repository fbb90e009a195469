"""swe-docker: an agent cannot mask its own failures by killing its container, cannot leave processes
running between commands, and concurrent first resets never read a torn package archive (issue
section 2).

The Docker tests share one env (one task, default ``Limits()``: 1 GiB memory, three tmpfs mounts) and
act through the agent's own ``bash`` tool, as a model would.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import re
import tarfile
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

import turngym

pytestmark = pytest.mark.reliability

TASK = "inflection-0.5.1__swapped_args__parameterize__122645fd"
COMMAND_TIMEOUT = 20.0


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def bash(env, command: str):
    obs, reward, terminated, truncated, info = env.step(call("bash", command=command))
    text = obs[0].content
    m = re.search(r"<returncode>(-?\d+)</returncode>", text)
    return (int(m.group(1)) if m else None), text, reward, terminated, info


@pytest.fixture(scope="module")
def env():
    e = turngym.make("swe-docker-v0", task_ids=[TASK], max_turns=50, command_timeout=COMMAND_TIMEOUT)
    yield e
    e.close()


def output(text: str) -> list[str]:
    return text.split("<output>", 1)[1].split("</output>", 1)[0].strip().splitlines()


def processes(env) -> list[str]:
    """``pid args`` of every process in the container but the ``ps`` command and its shell."""
    rc, out, *_ = bash(env, "ps -eo pid=,args=")
    return [ln.strip() for ln in output(out) if "ps -eo" not in ln]


@pytest.mark.docker
@pytest.mark.slow
def test_tmpfs_mounts_cannot_fill_the_memory_limit(env):
    """600 MB into /tmp and 600 MB into /testbed killed the container (tmpfs pages are charged to its
    1 GiB) and the episode was masked; the mounts are now sized to leave a reserve, the writes stop
    at the mounts' size and the container lives on."""
    env.reset(options={"task_id": TASK})
    container = env._sb.id
    rc, out, _, terminated, info = bash(
        env,
        "dd if=/dev/zero of=/tmp/fill bs=1M count=600 2>&1 | tail -1; "
        "dd if=/dev/zero of=/testbed/fill bs=1M count=600 2>&1 | tail -1; "
        "df -m /tmp /testbed /root | tail -3",
    )
    assert not terminated and "sandbox_error" not in info and not info.get("masked"), info
    sizes = [int(line.split()[1]) for line in output(out)[-3:]]
    assert sum(sizes) < 1024 - 200, out  # the three mounts leave room for the processes
    rc, out, *_ = bash(env, "rm -f /tmp/fill /testbed/fill; echo alive")
    assert rc == 0 and "alive" in out and env._sb.id == container


@pytest.mark.docker
@pytest.mark.slow
def test_oom_self_kill_is_a_failed_episode_not_a_masked_one(env):
    """The agent makes PID 1 the OOM killer's first choice, then allocates past the limit: the
    container dies. That is the policy's doing: reward 0, not masked, the cause in ``info``."""
    env.reset(options={"task_id": TASK})
    rc, out, reward, terminated, info = bash(
        env,
        "echo 0 > /proc/self/oom_score_adj; echo 1000 > /proc/1/oom_score_adj; "
        "python3 -c 'a = bytearray(700 << 20); b = bytearray(700 << 20)'",
    )
    assert terminated and reward == 0.0, (out, info)
    assert info["sandbox_death"] == "oom" and "out of memory" in info["sandbox_error"], info
    assert not info.get("masked"), info


@pytest.mark.docker
@pytest.mark.slow
def test_setsid_spinner_does_not_survive_its_command(env):
    """A CPU spinner in a session of its own left its command's process group, survived the command
    and its timeout, and kept the CPU for the rest of the episode; now only PID 1 is left."""
    env.reset(options={"task_id": TASK})
    rc, out, *_ = bash(env, "setsid sh -c 'while :; do :; done' >/dev/null 2>&1 </dev/null & echo started")
    assert "started" in out
    left = processes(env)
    assert [p.split()[0] for p in left] == ["1"], left
    rc, out, *_ = bash(env, "setsid -f sh -c 'while :; do :; done' >/dev/null 2>&1; sleep 1000")
    assert rc == 124, out  # cut at the command timeout
    left = processes(env)
    assert [p.split()[0] for p in left] == ["1"], left


def _sdist(name: str, version: str) -> bytes:
    """A sdist-shaped tarball with a few MB of members, so that a reader can catch a write half done."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for i in range(8):
            data = hashlib.sha256(str(i).encode()).digest() * (20_000 + i)
            info = tarfile.TarInfo(f"{name}-{version}/{name}/part{i}.py")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_concurrent_first_resets_never_read_a_torn_sdist(tmp_path, monkeypatch):
    """12 first resets at once, on an empty cache, fetch a package's sdist from a package index on
    loopback: each must read the whole archive (the old writer let readers see a partial file)."""
    from turngym.envs.swe.packages import PackageSpec, sdist_files

    blob = _sdist("zzpkg", "1.0")
    sha = hashlib.sha256(blob).hexdigest()

    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the handler's API
            if self.path.startswith("/simple/zzpkg"):
                url = f"http://127.0.0.1:{self.server.server_port}/files/zzpkg-1.0.tar.gz"
                files = [{"filename": "zzpkg-1.0.tar.gz", "url": url, "hashes": {"sha256": sha}}]
                body = json.dumps({"files": files}).encode()
            else:
                body = blob
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("TURNGYM_PYPI_SIMPLE", f"http://127.0.0.1:{server.server_port}/simple")
    monkeypatch.setenv("TURNGYM_CACHE_DIR", str(tmp_path))
    spec = PackageSpec("zzpkg", "1.0", sha, sources=("zzpkg/part0.py",), tests=())
    try:
        with ThreadPoolExecutor(12) as pool:
            results = list(pool.map(lambda _: sdist_files(spec), range(12)))
    finally:
        server.shutdown()
        server.server_close()
    assert all(r == results[0] and len(r) == 8 for r in results)
    left = sorted(p.name for p in (tmp_path / "sdists").iterdir())
    assert left == ["zzpkg-1.0.tar.gz"], left  # no temporary file left behind
