"""PID 1 of every sandbox: a zombie reaper and a command server on the container's stdin/stdout.

Standalone (the sandbox runs it with ``python3 -c``; it imports nothing from turngym). It ignores the
signals a process inside may send it, so ``kill 1`` does not end the container. Requests arrive on
stdin (attached by the host through the Docker API, so no ``docker exec`` and no runc start per
command); each is ``<4-byte big-endian length><JSON header><stdin bytes>`` and is answered on stdout
with ``<4-byte length><JSON>``. A command runs with bash in a new session; at its deadline, or when it
ends, the whole session gets SIGKILL, and then every process but PID 1 does (fork bombs, background
jobs and ``setsid`` children that left the session die too): between commands nothing else runs.
Commands get the highest OOM score, so the kernel's OOM killer picks them, never PID 1. Output keeps
its head and tail within ``max_bytes``.
"""

import base64
import json
import os
import select
import signal
import struct
import subprocess
import sys
import time


def _ignore_signals():
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGPIPE):
        signal.signal(s, signal.SIG_IGN)


def _default_signals():
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGPIPE):
        signal.signal(s, signal.SIG_DFL)
    try:  # raising one's own OOM score needs no privilege
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass


def _others():
    """Pids of the processes other than this one (PID 1), zombies included."""
    me = os.getpid()
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != me]


def _kill_all_but_me(rounds=200):
    """SIGKILL every other process until none is left (a forking process may add some during a
    sweep: sweep again), reaping the zombies; bounded, so PID 1 always answers."""
    for _ in range(rounds):
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
        _reap()
        if not _others():
            return
        time.sleep(0.005)


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _read_exactly(fd, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _kill_session(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run(req, stdin_data):
    limit = max(int(req.get("max_bytes", 1 << 20)), 2)
    half = limit // 2
    head, tail, total = bytearray(), bytearray(), 0
    env = dict(os.environ)
    env.update(req.get("env") or {})
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            ["bash", "-c", req["cmd"]],
            stdin=subprocess.PIPE if stdin_data else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=req.get("cwd") or None,
            env=env,
            start_new_session=True,
            preexec_fn=_default_signals,
        )
    except OSError as e:
        return {
            "code": 126,
            "timed_out": False,
            "total": 0,
            "out": base64.b64encode(f"{e}\n".encode()).decode(),
        }
    if stdin_data:
        try:
            proc.stdin.write(stdin_data)
        except OSError:
            pass
        try:
            proc.stdin.close()
        except OSError:
            pass
    deadline = start + float(req.get("timeout", 60))
    timed_out = False
    fd = proc.stdout.fileno()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if not ready:
            if proc.poll() is not None and not select.select([fd], [], [], 0)[0]:
                break  # the command ended; a descendant may still hold the pipe open
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        total += len(chunk)
        room = half - len(head)
        if room > 0:
            head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            tail += chunk
            if len(tail) > half:
                del tail[: len(tail) - half]
    if not timed_out:  # output closed: let the command finish before its leftovers are killed
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.05))
        except subprocess.TimeoutExpired:
            timed_out = True
    _kill_session(proc.pid)
    proc.stdout.close()
    code = proc.wait()
    _kill_all_but_me()
    if timed_out:
        code = 124
    elif code < 0:
        code = 128 - code
    out = bytes(head) + (b"\0TURNGYM-CUT\0" if total > len(head) + len(tail) else b"") + bytes(tail)
    return {"code": code, "timed_out": timed_out, "total": total, "out": base64.b64encode(out).decode()}


def main():
    _ignore_signals()
    fd_in, fd_out = sys.stdin.fileno(), sys.stdout.fileno()
    while True:
        ready, _, _ = select.select([fd_in], [], [], 1.0)
        _reap()
        if not ready:
            continue
        raw = _read_exactly(fd_in, 4)
        if raw is None:  # stdin closed: nobody attached; keep reaping until the host removes us
            while True:
                time.sleep(1.0)
                _reap()
        (n,) = struct.unpack(">I", raw)
        req = json.loads(_read_exactly(fd_in, n) or b"{}")
        stdin_data = _read_exactly(fd_in, int(req.get("stdin_len", 0))) if req.get("stdin_len") else b""
        try:
            resp = run(req, stdin_data)
        except Exception as e:  # noqa: BLE001 - answer, never die: PID 1 ending stops the container
            resp = {
                "code": 125,
                "timed_out": False,
                "total": 0,
                "out": base64.b64encode(repr(e).encode()).decode(),
            }
        resp["id"] = req.get("id")
        body = json.dumps(resp).encode()
        _write_all(fd_out, struct.pack(">I", len(body)) + body)
        _reap()


if __name__ == "__main__":
    main()
