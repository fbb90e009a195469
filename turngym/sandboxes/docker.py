"""``DockerSandbox``: one locked-down container on the local Docker Engine (through the ``docker`` SDK).

A sandbox is created from an image with no network, CPU / memory / pids limits and a read-only
root file system whose writable paths are size-limited tmpfs mounts (Docker copies the image's
content into them, so ``/testbed`` starts with the repository). PID 1 is a tiny Python init that
reaps zombies and ignores signals, so neither ``kill 1`` nor a fork bomb from inside ends the
container; only the host can.

``exec`` runs a shell command with a timeout that kills the command's whole process group (and, as
a fallback, every process but PID 1) while the container lives on; output is capped in memory
(head and tail kept) and decoded leniently, so binary or huge output cannot hurt the host.

Every container carries labels naming its owner process (host, pid, process start time) and run
id; :func:`reap_orphans` removes the containers of processes that no longer exist. The first
sandbox a process creates starts one reaper pass in the background, so a driver killed with
SIGKILL leaves nothing behind after the next driver starts (or ``turngym sandbox prune``). Open
sandboxes are closed at interpreter exit. Ownership, the exit cleanup and the background pass are
:mod:`turngym.sandboxes.reaping`'s, shared with the browser pool.
"""

from __future__ import annotations

import asyncio
import io
import shlex
import socket
import tarfile
import threading
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from turngym.sandboxes import reaping
from turngym.sandboxes.attach_channel import AttachChannel, FastPathLost
from turngym.sandboxes.limits import CappedOutput, ExecResult, Limits
from turngym.sandboxes.reaping import Owner, process_start_time  # noqa: F401 - re-exported (public name)

T = TypeVar("T")

LABEL_MANAGED = "turngym.managed"
LABEL_HOST = "turngym.owner.host"
LABEL_PID = "turngym.owner.pid"
LABEL_START = "turngym.owner.start"
LABEL_RUN_ID = "turngym.run_id"
LABEL_IMAGE = "turngym.image"

#: Exit code reported when a command is killed for running past its timeout (as GNU ``timeout``).
TIMEOUT_EXIT_CODE = 124

# Runs a command under GNU timeout (its own process group); when it ends, whatever it left behind in
# that group (background jobs, fork bombs) is killed too, and then every other process but PID 1
# (``setsid`` children leave the group).
_RUNNER = (
    'exec 3<&0; timeout -s KILL "$1" bash -c "$2" <&3 3<&- & t=$!; exec 3<&-; '
    "exec 4>&2 2>/dev/null; wait $t; rc=$?; kill -KILL -- -$t; kill -KILL -1; exec 2>&4 4>&-; exit $rc"
)

_SERVER_SOURCE: str | None = None


def _server_source() -> str:
    """The program PID 1 runs: a zombie reaper and command server (``exec_server.py``)."""
    global _SERVER_SOURCE
    if _SERVER_SOURCE is None:
        from pathlib import Path

        _SERVER_SOURCE = Path(__file__).with_name("exec_server.py").read_text()
    return _SERVER_SOURCE


_EXECUTOR: ThreadPoolExecutor | None = None
_EXECUTOR_LOCK = threading.Lock()


class SandboxError(RuntimeError):
    """A sandbox operation failed (daemon error, bad path, ...)."""


class SandboxDead(SandboxError):
    """The container is gone or stopped (killed from outside, removed, daemon restarted).

    ``cause`` says who ended it as far as Docker knows: ``"oom"`` when the kernel's OOM killer ended
    the container (its own processes ran it out of memory: the agent's doing), else ``"external"``.
    """

    def __init__(self, message: str, cause: str = "external"):
        super().__init__(message)
        self.cause = cause


def executor() -> ThreadPoolExecutor:
    """The thread pool that runs blocking Docker calls for the async API (wider than asyncio's default)."""
    global _EXECUTOR
    with _EXECUTOR_LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = ThreadPoolExecutor(max_workers=64, thread_name_prefix="turngym-docker")
        return _EXECUTOR


async def run_blocking(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a blocking call on :func:`executor` from async code."""
    return await asyncio.get_running_loop().run_in_executor(executor(), partial(fn, *args, **kwargs))


_CLIENT: Any = None


def docker_client() -> Any:
    """A process-wide ``docker.DockerClient`` from the environment; a clear error if no daemon answers."""
    global _CLIENT
    if _CLIENT is None:
        import docker

        try:
            client = docker.from_env(timeout=120)
            client.ping()
        except Exception as e:  # noqa: BLE001 - any failure means: no usable daemon
            raise SandboxError(
                f"cannot reach the Docker daemon ({type(e).__name__}: {e}). Start it, e.g. "
                "`dockerd > /tmp/dockerd.log 2>&1 &`, and check `docker info`."
            ) from e
        _CLIENT = client
    return _CLIENT


def docker_available() -> bool:
    try:
        docker_client()
    except SandboxError:
        return False
    return True


def owner_labels(run_id: str | None = None) -> dict[str, str]:
    """Labels that tie a container to this process (and a run id) for reaping."""
    owner = Owner.current()
    return {
        LABEL_MANAGED: "1",
        LABEL_HOST: owner.host,
        LABEL_PID: str(owner.pid),
        LABEL_START: owner.start,
        LABEL_RUN_ID: run_id or "",
    }


def owner_alive(labels: Mapping[str, str]) -> bool:
    """Whether the process named in a container's labels still runs (unknown hosts count as alive)."""
    pid = labels.get(LABEL_PID, "")
    owner = Owner(labels.get(LABEL_HOST, ""), int(pid) if pid.isdigit() else -1, labels.get(LABEL_START, ""))
    return owner.alive()


def managed_containers(client: Any = None, run_id: str | None = None) -> list[Any]:
    """All containers (running or not) that turngym created, optionally of one run. A container removed
    while the list is read (a pool returning it, a reaper) is left out, not an error."""
    client = client or docker_client()
    filters = [f"{LABEL_MANAGED}=1"] + ([f"{LABEL_RUN_ID}={run_id}"] if run_id else [])
    return client.containers.list(all=True, filters={"label": filters}, ignore_removed=True)


def reap_orphans(client: Any = None, *, run_id: str | None = None, everything: bool = False) -> list[str]:
    """Remove turngym containers whose owner process is dead (or all of them with ``everything``).

    Returns the names of the removed containers. Containers of live processes are left alone.
    """
    client = client or docker_client()
    import docker.errors

    removed = []
    for c in managed_containers(client, run_id):
        if not everything and owner_alive(c.labels):
            continue
        try:
            c.remove(force=True)
            removed.append(c.name)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as e:
            if "already in progress" not in str(e):
                raise
    return removed


def _start_reaper_once(client: Any) -> None:
    reaping.start_once("docker-reaper", lambda: reap_orphans(client))


def tar_of(files: Mapping[str, bytes | str], mode: int = 0o644) -> bytes:
    """A tar archive of ``files`` (absolute or relative path -> content), for ``tar -x -C /``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, data in files.items():
            raw = data.encode() if isinstance(data, str) else bytes(data)
            info = tarfile.TarInfo(name=path.lstrip("/"))
            info.size = len(raw)
            info.mode = mode
            info.mtime = int(time.time())
            tar.addfile(info, io.BytesIO(raw))
    return buf.getvalue()


def _rel_dir(path: str) -> str:
    if not path.startswith("/") or ".." in path.split("/") or path.strip("/") == "":
        raise SandboxError(f"snapshot paths must be absolute directories below /, without '..', got {path!r}")
    return path.strip("/")


class DockerSandbox:
    """One running container. Use :meth:`create`; always :meth:`close` (also a context manager)."""

    def __init__(self, container: Any, client: Any, *, image: str, run_id: str = "", fast_exec: bool = True):
        self.container = container
        self.fast_exec = fast_exec
        self.client = client
        #: requests to PID 1's command server over the attach stream (the fast path of ``exec``)
        self.channel = AttachChannel(client, container.id, self.alive, self._kill_strays)
        self.image = image
        self.run_id = run_id
        self.id: str = container.id
        self.name: str = container.name
        self.created_at = time.time()
        self._closed = False
        reaping.own(self)  # closed at interpreter exit unless closed before

    # ------------------------------------------------------------ lifecycle
    @classmethod
    def create(
        cls,
        image: str,
        *,
        limits: Limits | None = None,
        run_id: str | None = None,
        labels: Mapping[str, str] | None = None,
        workdir: str | None = None,
        environment: Mapping[str, str] | None = None,
        client: Any = None,
        fast_exec: bool = True,
    ) -> DockerSandbox:
        """Create and start a container from ``image`` with ``limits``; raises :class:`SandboxError`.

        With ``fast_exec`` commands go to PID 1 over the attached stdin/stdout (no ``docker exec``
        per command); if that channel breaks, the sandbox falls back to ``docker exec`` for good.
        """
        import docker.errors

        client = client or docker_client()
        _start_reaper_once(client)
        limits = limits or Limits()
        all_labels = {**owner_labels(run_id), LABEL_IMAGE: image, **dict(labels or {})}
        tmpfs = {p: f"rw,exec,size={limits.tmpfs_mb}m" for p in limits.writable}
        name = f"turngym-{uuid.uuid4().hex[:12]}"
        try:
            container = client.containers.create(  # create + start: never pulls from a registry
                image,
                command=["python3", "-c", _server_source()],
                stdin_open=True,
                name=name,
                labels=all_labels,
                network_mode=limits.network,
                nano_cpus=int(limits.cpus * 1e9),
                mem_limit=f"{limits.memory_mb}m",
                memswap_limit=f"{limits.memory_mb}m",
                pids_limit=limits.pids,
                read_only=limits.read_only,
                tmpfs=tmpfs,
                working_dir=workdir,
                environment=dict(environment or {}),
                cap_drop=["NET_RAW", "SYS_ADMIN", "MKNOD", "SYS_CHROOT"],
                security_opt=["no-new-privileges"],
                init=False,
            )
            container.start()
        except docker.errors.ImageNotFound as e:
            raise SandboxError(f"image {image!r} not found; build it with `turngym sandbox build`") from e
        except docker.errors.APIError as e:
            try:
                client.containers.get(name).remove(force=True)
            except docker.errors.APIError:
                pass
            raise SandboxError(f"could not start a container from {image!r}: {e}") from e
        return cls(container, client, image=image, run_id=run_id or "", fast_exec=fast_exec)

    def close(self) -> None:
        """Remove the container (idempotent; a container already gone is fine)."""
        import docker.errors

        if self._closed:
            return
        self._closed = True
        reaping.disown(self)
        self.channel.close()
        try:
            self.client.api.remove_container(self.id, force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as e:
            if "already in progress" not in str(e):
                raise SandboxError(f"could not remove container {self.name}: {e}") from e

    @property
    def closed(self) -> bool:
        return self._closed

    def alive(self) -> bool:
        """True if the container exists and runs."""
        import docker.errors

        if self._closed:
            return False
        try:
            state = self.client.api.inspect_container(self.id)["State"]
        except docker.errors.APIError:
            return False
        return bool(state.get("Running")) and not state.get("Restarting")

    def __enter__(self) -> DockerSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DockerSandbox({self.name}, image={self.image!r}{', closed' if self._closed else ''})"

    # ------------------------------------------------------------ commands
    def exec(
        self,
        command: str,
        *,
        timeout: float = 60.0,
        workdir: str | None = None,
        environment: Mapping[str, str] | None = None,
        max_output_bytes: int = 1 << 20,
        stdin: bytes | None = None,
    ) -> ExecResult:
        """Run ``command`` with bash; kill it (not the container) after ``timeout`` seconds.

        stdout and stderr come back interleaved; beyond ``max_output_bytes`` only the head and tail
        are kept, with a marker. ``stdin`` bytes are fed to the command. Raises :class:`SandboxDead`
        when the container is not running.
        """
        self._check_open()
        secs = max(float(timeout), 0.001)
        start = time.perf_counter()
        if self.fast_exec:
            try:
                resp, out = self.channel.request(command, secs, workdir, environment, max_output_bytes, stdin)
                return self._fast_result(resp, out, start)
            except FastPathLost as e:
                self._leave_fast_path(e)
                if e.sent:  # it may have run: never run a command twice
                    raise SandboxError(
                        f"lost the connection to a running command ({e}); it was killed"
                    ) from e
        argv = ["bash", "-c", _RUNNER, "turngym-exec", f"{secs:.3f}", command]
        code, out = self._exec_raw(argv, secs, workdir, environment, max_output_bytes, stdin)
        elapsed = time.perf_counter() - start
        text, truncated = out.text()
        timed_out = code in (137, TIMEOUT_EXIT_CODE, -1) and elapsed >= secs * 0.98
        if code == 137 and not timed_out and not self.alive():
            raise self._died(f"container {self.name} died while running a command")
        return ExecResult(
            exit_code=TIMEOUT_EXIT_CODE if timed_out else int(code),
            output=text,
            timed_out=timed_out,
            truncated=truncated,
            output_bytes=out.total,
            elapsed_s=elapsed,
        )

    # ---- the fast path: requests to PID 1 over the attached stdin/stdout
    @staticmethod
    def _fast_result(resp: dict[str, Any], out: bytes, start: float) -> ExecResult:
        """The ExecResult of PID 1's answer ``resp`` and output ``out`` (head and tail when cut)."""
        total = int(resp.get("total", len(out)))
        head, cut, tail = out.partition(b"\0TURNGYM-CUT\0")
        truncated = bool(cut)
        if truncated:
            dropped = total - len(head) - len(tail)
            text = (
                head.decode("utf-8", errors="replace")
                + f"\n[... {dropped} bytes of output truncated ...]\n"
                + tail.decode("utf-8", errors="replace")
            )
        else:
            text = out.decode("utf-8", errors="replace")
        return ExecResult(
            exit_code=int(resp.get("code", -1)),
            output=text,
            timed_out=bool(resp.get("timed_out")),
            truncated=truncated,
            output_bytes=total,
            elapsed_s=time.perf_counter() - start,
        )

    def _exec_bytes(
        self, command: str, timeout: float, *, stdin: bytes | None = None, max_bytes: int = 1 << 20
    ) -> tuple[int, bytes, int]:
        """Run an idempotent ``command``: exit code, raw output (head and tail within ``max_bytes``)
        and the output's full size. Through PID 1 when the fast path works, else ``docker exec``
        (a request lost on the way is run again there: only for commands that may run twice)."""
        self._check_open()
        if self.fast_exec:
            try:
                resp, out = self.channel.request(command, timeout, None, None, max_bytes, stdin)
                return int(resp.get("code", -1)), out, int(resp.get("total", len(out)))
            except FastPathLost as e:
                self._leave_fast_path(e)
        code, out = self._exec_raw(["bash", "-c", command], timeout, max_output_bytes=max_bytes, stdin=stdin)
        return code, bytes(out.head + out.tail), out.total

    def _exec_raw(
        self,
        argv: list[str],
        timeout: float,
        workdir: str | None = None,
        environment: Mapping[str, str] | None = None,
        max_output_bytes: int = 1 << 20,
        stdin: bytes | None = None,
    ) -> tuple[int, CappedOutput]:
        import docker.errors
        from docker.utils.socket import frames_iter

        self._check_open()
        api = self.client.api
        try:
            exec_id = api.exec_create(
                self.id,
                argv,
                stdout=True,
                stderr=True,
                stdin=stdin is not None,
                tty=False,
                workdir=workdir,
                environment=dict(environment) if environment else None,
            )["Id"]
            sock = api.exec_start(exec_id, socket=True)
        except docker.errors.APIError as e:
            raise self._dead_or_error(e) from e
        # Fallback: a process that left the process group keeps the stream open; kill all but PID 1.
        guard = threading.Timer(timeout + 5.0, self._kill_strays)
        guard.daemon = True
        guard.start()
        out = CappedOutput(max_output_bytes)
        try:
            if stdin is not None:
                raw = getattr(sock, "_sock", sock)
                raw.sendall(stdin)
                raw.shutdown(socket.SHUT_WR)
            for _stream, chunk in frames_iter(sock, tty=False):
                out.add(chunk)
        except Exception as e:  # noqa: BLE001 - a broken stream: the container probably died
            if not self.alive():
                raise self._died(f"container {self.name} died while running a command") from e
            raise SandboxError(f"lost the output stream of a command: {e}") from e
        finally:
            guard.cancel()
            sock.close()
        try:
            code = api.exec_inspect(exec_id).get("ExitCode")
        except docker.errors.APIError as e:
            raise self._dead_or_error(e) from e
        return (-1 if code is None else int(code)), out

    def _kill_strays(self) -> None:
        try:
            self.client.api.exec_start(
                self.client.api.exec_create(self.id, ["kill", "-9", "-1"])["Id"], detach=True
            )
        except Exception:  # noqa: BLE001 - the container may be gone; the stream then ends anyway
            pass

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxDead(f"sandbox {self.name} is closed")

    def _not_running(self) -> SandboxDead:
        return self._died(f"container {self.name} is not running")

    def death_cause(self) -> str:
        """``"oom"`` if Docker saw the kernel's OOM killer in this (stopped) container, else ``"external"``."""
        import docker.errors

        try:
            state = self.client.api.inspect_container(self.id)["State"]
        except docker.errors.APIError:
            return "external"
        return "oom" if state.get("OOMKilled") else "external"

    def _died(self, message: str) -> SandboxDead:
        cause = self.death_cause()
        why = (
            "its processes ran it out of memory (OOM-killed)"
            if cause == "oom"
            else "killed or removed from outside"
        )
        return SandboxDead(f"{message} ({why})", cause=cause)

    def _leave_fast_path(self, e: FastPathLost) -> None:
        """The fast path broke: ``docker exec`` from now on; SandboxDead if the container is gone."""
        self.fast_exec = False
        self.channel.close()
        if not self.alive():
            raise self._not_running() from e

    def _dead_or_error(self, e: Exception) -> SandboxError:
        if not self.alive():
            return self._not_running()
        return SandboxError(f"docker error in {self.name}: {e}")

    # ------------------------------------------------------------ files
    def put_files(
        self, files: Mapping[str, bytes | str], *, mode: int = 0o644, timeout: float = 120.0
    ) -> None:
        """Write files (absolute paths -> content) into the container, creating parent directories.

        The files travel as a tar archive on the stdin of ``tar -x`` inside the container, which
        also works for tmpfs mounts and read-only root file systems (``docker cp`` does not).
        """
        if not files:
            return
        for path in files:
            if not path.startswith("/") or ".." in path.split("/"):
                raise SandboxError(f"put_files needs absolute paths without '..', got {path!r}")
        code, out = self._exec_raw(["tar", "-x", "-C", "/", "-f", "-"], timeout, stdin=tar_of(files, mode))
        if code != 0:
            raise SandboxError(f"writing {len(files)} file(s) failed: {out.text()[0].strip()[:2000]}")

    def get_file(self, path: str, *, max_bytes: int = 16 << 20, timeout: float = 60.0) -> bytes:
        """Read one regular file from the container (raises :class:`SandboxError` if missing or too big)."""
        script = 'test -f "$1" || { echo "no such file: $1" >&2; exit 3; }; s=$(stat -c %s "$1"); '
        script += (
            f'[ "$s" -le {int(max_bytes)} ] || {{ echo "$1 is $s bytes, over the limit" >&2; exit 4; }}; '
        )
        script += 'exec cat -- "$1"'
        code, out = self._exec_raw(
            ["bash", "-c", script, "get", path], timeout, max_output_bytes=max(max_bytes + 2, 8192)
        )
        data = bytes(out.head + out.tail)
        if code != 0:
            raise SandboxError(data.decode(errors="replace").strip() or f"reading {path} failed ({code})")
        return data

    def snapshot(
        self, paths: tuple[str, ...] | list[str], *, max_bytes: int, timeout: float = 300.0
    ) -> bytes:
        """A tar archive of ``paths`` (absolute directories, e.g. the writable tmpfs mounts) as they are now.

        Made by ``tar -c`` inside the container (``docker commit`` and ``docker cp`` do not see tmpfs
        mounts); an archive over ``max_bytes`` is a :class:`SandboxError`, never a cut one. Raises
        :class:`SandboxDead` if the container is not running.
        """
        rel = " ".join(shlex.quote(_rel_dir(p)) for p in paths)
        code, data, total = self._exec_bytes(
            f"tar -c -C / -f - -- {rel} 2>/dev/null", timeout, max_bytes=max_bytes + 2
        )
        if total > len(data) or total > max_bytes:
            raise SandboxError(f"the snapshot of {', '.join(paths)} is over {max_bytes} bytes")
        if code != 0:
            if not self.alive():
                raise self._died(f"container {self.name} died while its files were archived")
            raise SandboxError(f"archiving {', '.join(paths)} in {self.name} failed (tar exit code {code})")
        return data

    def restore(self, paths: tuple[str, ...] | list[str], archive: bytes, *, timeout: float = 300.0) -> None:
        """Make ``paths`` hold exactly what ``archive`` (a :meth:`snapshot`) holds: their contents are
        removed, then the archive is unpacked (modes, owners and times kept)."""
        rel = " ".join(shlex.quote("/" + _rel_dir(p)) for p in paths)
        script = (
            f'for p in {rel}; do find "$p" -mindepth 1 -delete || exit 3; done; exec tar -x -p -C / -f - 2>&1'
        )
        code, out, _ = self._exec_bytes(script, timeout, stdin=archive, max_bytes=8192)
        if code != 0:
            if not self.alive():
                raise self._died(f"container {self.name} died while a snapshot was unpacked")
            text = out.decode(errors="replace").strip()[:2000]
            raise SandboxError(f"unpacking a snapshot into {self.name} failed ({code}): {text}")

    # ------------------------------------------------------------ async API
    async def aexec(self, command: str, **kwargs: Any) -> ExecResult:
        return await run_blocking(self.exec, command, **kwargs)

    async def aput_files(self, files: Mapping[str, bytes | str], **kwargs: Any) -> None:
        await run_blocking(self.put_files, files, **kwargs)

    async def aget_file(self, path: str, **kwargs: Any) -> bytes:
        return await run_blocking(self.get_file, path, **kwargs)

    async def aalive(self) -> bool:
        return await run_blocking(self.alive)

    async def aclose(self) -> None:
        await run_blocking(self.close)
