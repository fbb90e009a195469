"""``DesktopSandbox``: an X desktop (Xvfb, openbox, D-Bus, AT-SPI) in a locked-down container.

The container is an ordinary :class:`~turngym.sandboxes.docker.DockerSandbox` of the desktop image
(:mod:`turngym.sandboxes.desktop_image`): no network, CPU / memory / pids limits, read-only root with
tmpfs ``/tmp`` and home, owner labels (reaped like every sandbox). :func:`start_session` starts the
desktop in it as the unprivileged user (the warm pool runs it before a container counts as warm), and
the desktop's processes outlive the command that started them (:func:`exec_plain`; never ``exec``, whose
clean-up would kill them).

Input goes through ``xdotool``, screenshots through ``xwd`` (decoded and PNG-encoded on the host), the
accessibility tree through AT-SPI (:mod:`turngym.sandboxes.desktop_a11y_dump`), all by default through
the long-lived helper process (:mod:`turngym.sandboxes.desktop_helper`): :meth:`DesktopSandbox.act` and
:meth:`DesktopSandbox.observe` are one round trip each (``helper=False``: one ``docker exec`` per
command, as before, also the fallback when the helper is lost). Every command the
desktop's user could influence runs as that user; root commands (setup, checkers) read files the user
cannot reach. A dead X server is a :class:`DesktopDead`; a stuck command is cut at its timeout.
"""

from __future__ import annotations

import io
import json
import shlex
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from turngym.sandboxes.desktop_channel import HelperChannel, HelperLost
from turngym.sandboxes.desktop_helper import BadRequest, action_argv
from turngym.sandboxes.desktop_image import HOME, UID, desktop_image
from turngym.sandboxes.docker import DockerSandbox, SandboxError
from turngym.sandboxes.limits import Limits
from turngym.sandboxes.pool import SandboxPool

DISPLAY = ":0"
BUS = "unix:path=/tmp/.turngym-bus"
RUNTIME_DIR = "/tmp/.xdg-runtime"
#: the environment of every command run as the desktop user
USER_ENV = {
    "HOME": HOME,
    "USER": "user",
    "LOGNAME": "user",
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "DISPLAY": DISPLAY,
    "DBUS_SESSION_BUS_ADDRESS": BUS,
    "XDG_RUNTIME_DIR": RUNTIME_DIR,
    "LANG": "C.UTF-8",
    "NO_AT_BRIDGE": "0",
    "GTK_A11Y": "atspi",
    "GTK_OVERLAY_SCROLLING": "0",
    "NO_AT_BRIDGE_DEBUG": "0",
}
DESKTOP_LIMITS = Limits(
    cpus=1.0, memory_mb=1536, pids=512, disk_mb=256, writable=("/tmp", HOME), read_only=True
)
_GTK_SETTINGS = """[Settings]
gtk-cursor-blink = false
gtk-enable-animations = false
gtk-recent-files-enabled = false
gtk-font-name = DejaVu Sans 10
"""
_A11Y_SCRIPT = Path(__file__).with_name("desktop_a11y_dump.py").read_text()


class DesktopDead(SandboxError):
    """The desktop's X server is gone (killed, crashed) or its container died."""


@dataclass
class Observation:
    """What :meth:`DesktopSandbox.observe` read: the screen, the app's state, and what was asked for."""

    image: Any
    state: str = "running"
    nodes: list[dict[str, Any]] = field(default_factory=list)
    clipboard: str | None = None
    stat: dict[str, Any] | None = None


def exec_plain(
    sb: DockerSandbox,
    argv: list[str],
    *,
    timeout: float = 60.0,
    stdin: bytes | None = None,
    max_bytes: int = 1 << 20,
) -> tuple[int, bytes, int]:
    """Run ``argv`` in ``sb`` by ``docker exec`` without ``DockerSandbox.exec``'s clean-up (which kills
    every process but PID 1 after each command): what it starts in the background keeps running, as the
    desktop must. Returns the exit code, the output (head and tail within ``max_bytes``) and its size."""
    code, out = sb._exec_raw(list(argv), timeout, max_output_bytes=max_bytes, stdin=stdin)
    return code, bytes(out.head + out.tail), out.total


def _as_user(script: str) -> list[str]:
    env = [f"{k}={v}" for k, v in USER_ENV.items()]
    return [
        "setpriv", f"--reuid={UID}", f"--regid={UID}", "--init-groups", "--inh-caps=-all",
        "env", "-i", *env, "bash", "-c", script,
    ]  # fmt: skip


def _session_script(width: int, height: int) -> str:
    """Root: own the home, then start X, the session bus and the window manager as the user."""
    user = " ".join(shlex.quote(a) for a in _as_user("true")[:-3])
    return f"""
set -e
chown {UID}:{UID} {HOME} && chmod 700 {HOME}
mkdir -p {RUNTIME_DIR} && chown {UID}:{UID} {RUNTIME_DIR} && chmod 700 {RUNTIME_DIR}
run() {{ {user} bash -c "$1" </dev/null >/dev/null 2>&1; }}
mkdir -p {HOME}/.config/gtk-3.0 {HOME}/Desktop {HOME}/Documents
printf %s {shlex.quote(_GTK_SETTINGS)} > {HOME}/.config/gtk-3.0/settings.ini
# a prompt without the host name (the container's id): screens repeat across containers (fork replay)
echo 'PS1="user:\\w\\$ "' >> {HOME}/.bashrc
chown -R {UID}:{UID} {HOME}
run 'setsid -f Xvfb {DISPLAY} -screen 0 {width}x{height}x24 -nolisten tcp -noreset +extension RANDR'
for i in $(seq 1 100); do [ -e /tmp/.X11-unix/X0 ] && break; sleep 0.05; done
run 'setsid -f dbus-daemon --session --nofork --address={BUS}'
for i in $(seq 1 100); do [ -e /tmp/.turngym-bus ] && break; sleep 0.05; done
# openbox drops the map requests that arrive while it starts (the app's window then never shows): wait
# until it runs its startup command, which it does once it manages the screen
run 'setsid -f openbox --startup "touch /tmp/.turngym-wm-ready"'
for i in $(seq 1 200); do [ -e /tmp/.turngym-wm-ready ] && break; sleep 0.05; done
run 'setsid -f /usr/libexec/at-spi-bus-launcher --launch-immediately'
# the accessibility bus and its registry daemon up before any app starts: an app's first start would
# otherwise activate them itself and block on them (its GTK bridge waits on the buses) under load
for i in $(seq 1 200); do
  A=$({user} dbus-send --session --print-reply=literal --dest=org.a11y.Bus /org/a11y/bus org.a11y.Bus.GetAddress 2>/dev/null) && [ -n "$A" ] && break
  sleep 0.05
done
A=$(echo $A)
for i in $(seq 1 200); do
  {user} dbus-send --bus="$A" --print-reply --dest=org.a11y.atspi.Registry /org/a11y/atspi/registry \
    org.freedesktop.DBus.Peer.Ping >/dev/null 2>&1 && break
  sleep 0.05
done
for i in $(seq 1 100); do {user} xdotool getdisplaygeometry >/dev/null 2>&1 && break; sleep 0.05; done
[ -e /tmp/.turngym-wm-ready ] || echo "openbox did not start"
{user} xdotool getdisplaygeometry
"""


def start_session(sb: DockerSandbox, width: int, height: int, timeout: float = 30.0) -> None:
    """Start the desktop in ``sb`` (root commands through ``exec_plain``); a ``SandboxError`` if it
    does not come up."""
    code, out, _ = exec_plain(sb, ["bash", "-c", _session_script(width, height)], timeout=timeout)
    text = out.decode(errors="replace")
    if code != 0 or f"{width} {height}" not in text:
        raise SandboxError(f"the desktop did not start (exit {code}): {text[-1500:]}")


def decode_xwd(data: bytes) -> Any:
    """An ``xwd`` dump (ZPixmap, 24/32 bits per pixel) as a PIL RGB image."""
    import numpy as np
    from PIL import Image

    if len(data) < 100:
        raise SandboxError(f"screenshot failed: {data[:200].decode(errors='replace')}")
    header = struct.unpack(">25I", data[:100])
    header_size, fmt, depth, width, height = header[0], header[2], header[3], header[4], header[5]
    byte_order, bpp, bpl, ncolors = header[7], header[11], header[12], header[19]
    if fmt != 2 or bpp not in (24, 32) or depth not in (24, 32):
        raise SandboxError(f"unsupported xwd screenshot (format {fmt}, {bpp} bits per pixel)")
    start = header_size + ncolors * 12
    need = start + bpl * height
    if len(data) < need:
        raise SandboxError(f"truncated screenshot ({len(data)} of {need} bytes)")
    step = bpp // 8
    raw = np.frombuffer(data, dtype=np.uint8, count=bpl * height, offset=start).reshape(height, bpl)
    px = raw[:, : width * step].reshape(height, width, step)
    # LSB-first pixels with red in the high byte (the X default) are stored B, G, R(, pad)
    rgb = px[:, :, [2, 1, 0]] if byte_order == 0 else px[:, :, [step - 3, step - 2, step - 1]]
    return Image.fromarray(np.ascontiguousarray(rgb), "RGB")


def png_bytes(image: Any) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


class DesktopSandbox:
    """A desktop session in a container (from :func:`desktop_pool` or :meth:`create`)."""

    def __init__(self, sb: DockerSandbox, width: int, height: int, *, helper: bool = True):
        self.sb = sb
        self.width, self.height = width, height
        self.helper = HelperChannel(sb, width, height, _as_user) if helper else None

    @classmethod
    def create(cls, width: int = 1024, height: int = 768, *, image: str | None = None) -> DesktopSandbox:
        """A fresh container with a started desktop (no pool); close it."""
        sb = DockerSandbox.create(image or desktop_image().tag, limits=DESKTOP_LIMITS, run_id="desktop")
        try:
            start_session(sb, width, height)
        except BaseException:
            sb.close()
            raise
        return cls(sb, width, height)

    # ------------------------------------------------------------ commands
    def run_user(
        self, script: str, *, timeout: float = 15.0, stdin: bytes | None = None, max_bytes: int = 1 << 20
    ) -> tuple[int, bytes]:
        """Run ``script`` (bash) as the desktop user with the session's environment."""
        code, out, _ = exec_plain(
            self.sb, _as_user(script), timeout=timeout, stdin=stdin, max_bytes=max_bytes
        )
        return code, out

    def run_root(
        self, script: str, *, timeout: float = 30.0, stdin: bytes | None = None, max_bytes: int = 1 << 20
    ) -> tuple[int, bytes]:
        """Run ``script`` (bash) as root (setup and checkers; never with agent-chosen text)."""
        code, out, _ = exec_plain(
            self.sb, ["bash", "-c", script], timeout=timeout, stdin=stdin, max_bytes=max_bytes
        )
        return code, out

    def x_alive(self) -> bool:
        """Whether the container runs and its X server answers."""
        if not self.sb.alive():
            return False
        try:
            code, _ = self.run_user("xdotool getdisplaygeometry", timeout=5.0)
        except SandboxError:
            return False
        return code == 0

    def check_alive(self) -> None:
        if not self.x_alive():
            why = "its container is gone" if not self.sb.alive() else "the X server does not answer"
            raise DesktopDead(f"the desktop died: {why}")

    def xdotool(self, *commands: list[str], timeout: float = 15.0) -> str:
        """Run ``xdotool`` once per argument list, in order (arguments quoted, never a shell string);
        a ``SandboxError`` on the first failure, :class:`DesktopDead` if the X server is gone."""
        script = " && ".join("xdotool " + shlex.join(args) for args in commands)
        code, out = self.run_user(script, timeout=timeout)
        text = out.decode(errors="replace")
        if code != 0 or "No such key name" in text or "Invalid" in text:
            if not self.x_alive():
                raise DesktopDead("the desktop died: the X server does not answer")
            raise SandboxError(f"xdotool failed ({code}): {text.strip()[:500]}")
        return text

    # ------------------------------------------------------------ one step
    def _use_helper(self) -> HelperChannel | None:
        return self.helper if self.helper is not None and not self.helper.broken else None

    def act(self, actions: list[dict[str, Any]], *, timeout: float = 15.0) -> None:
        """Run actions of the helper's vocabulary (:func:`~turngym.sandboxes.desktop_helper.action_argv`)
        in order; a ``SandboxError`` on the first failure, :class:`DesktopDead` if X is gone."""
        try:
            argvs = [action_argv(a, self.width, self.height) for a in actions]
        except BadRequest as e:
            raise SandboxError(f"not a desktop action: {e}") from e
        helper = self._use_helper()
        if helper is None:
            self.xdotool(*argvs, timeout=timeout)
            return
        try:
            ans, _ = helper.request({"actions": actions}, timeout + 10.0)
        except HelperLost as e:
            self.check_alive()
            if e.sent:
                raise SandboxError(f"the desktop helper stopped answering during an action: {e}") from e
            self.xdotool(*argvs, timeout=timeout)
            return
        if not ans.get("ok"):
            if ans.get("state") == "dead":
                raise DesktopDead("the desktop died: the X server does not answer")
            raise SandboxError(str(ans.get("error", "the action failed")))

    def observe(
        self,
        *,
        settle_s: float = 0.3,
        app: tuple[str, str] | None = None,
        a11y: bool = False,
        clipboard: bool = False,
        stat: list[str] | None = None,
    ) -> Observation:
        """Let the screen settle (through the helper: until two captures agree, at most ``settle_s``;
        without it: ``settle_s``), then the screenshot, the app's state (:meth:`app_state`) and optionally
        the accessibility tree, the clipboard text and ``stat`` of paths. :class:`DesktopDead` if X is gone."""
        helper = self._use_helper()
        if helper is not None:
            req: dict[str, Any] = {"observe": True, "settle": {"max": settle_s}, "a11y": a11y,
                                   "clipboard": clipboard, "stat": list(stat or [])}  # fmt: skip
            if app is not None:
                req["app"] = {"name": app[0], "class": app[1]}
            try:
                ans, blob = helper.request(req, 60.0)
            except HelperLost:
                self.check_alive()
            else:
                if ans.get("state") == "dead":
                    self.check_alive()
                    raise DesktopDead("the desktop died: the X server does not answer")
                if not ans.get("ok", True):
                    raise SandboxError(str(ans.get("error")))
                nodes = [n for n in ans.get("a11y", []) if isinstance(n, dict) and "role" in n]
                return Observation(decode_xwd(blob), ans.get("state", "running"), nodes,
                                   ans.get("clipboard"), ans.get("stat"))  # fmt: skip
        import time

        time.sleep(settle_s)
        state = self.app_state(*app) if app is not None else "running"
        if state == "dead":
            raise DesktopDead("the desktop died: the X server does not answer")
        return Observation(self.screenshot(), state, self.a11y_nodes() if a11y else [])

    def launch(self, argv: list[str], *, window_class: str, timeout: float = 60.0) -> None:
        """Start an application as the user and wait until one of its windows shows (a ``SandboxError``
        naming the app and its log if none does within ``timeout``)."""
        cmd = shlex.join(argv)
        code, _ = self.run_user(
            f"cd ~ && setsid -f {cmd} </dev/null >/tmp/.app.log 2>&1; "
            f"timeout {timeout:g} xdotool search --sync --onlyvisible --class {shlex.quote(window_class)} "
            ">/dev/null",
            timeout=timeout + 5,
        )
        if code == 0:
            return
        self.run_user(f"pkill -KILL -x {shlex.quote(Path(argv[0]).name[:15])} || true", timeout=10)
        _, log = self.run_root("tail -c 1500 /tmp/.app.log 2>/dev/null", timeout=10)
        raise SandboxError(f"{argv[0]} showed no window within {timeout:g} s: {log.decode(errors='replace')}")

    def app_state(self, name: str, window_class: str, grace_s: float = 3.0) -> str:
        """``"dead"`` (the X server or the container is gone), ``"exited"`` (the application ``name`` has
        exited) or ``"running"``, in one command. While the app shows a window it runs; without one it
        gets ``grace_s`` to finish exiting (saving its settings) before it counts as still running."""
        rounds = max(1, int(grace_s / 0.1))
        script = (
            "xdotool getdisplaygeometry >/dev/null 2>&1 || exit 3; "
            f"for i in $(seq {rounds}); do pgrep -u {UID} -x {shlex.quote(name)} >/dev/null || exit 0; "
            f"xdotool search --onlyvisible --class {shlex.quote(window_class)} >/dev/null && exit 1; "
            "sleep 0.1; done; exit 1"
        )
        try:
            code, _ = self.run_user(script, timeout=grace_s + 10)
        except SandboxError:
            return "dead"
        return {0: "exited", 1: "running"}.get(code, "dead")

    def screenshot(self) -> Any:
        """The screen as a PIL RGB image."""
        code, out = self.run_user(
            f"exec xwd -root -silent -display {DISPLAY}", timeout=15.0, max_bytes=64 << 20
        )
        if code != 0:
            self.check_alive()
            raise SandboxError(f"screenshot failed ({code}): {out[:300].decode(errors='replace')}")
        return decode_xwd(out)

    def a11y_nodes(self, timeout: float = 10.0) -> list[dict[str, Any]]:
        """The showing nodes of the accessibility tree (see :mod:`desktop_a11y_dump`); [] if AT-SPI fails."""
        helper = self._use_helper()
        if helper is not None:
            try:
                ans, _ = helper.request({"a11y": True}, timeout)
                return [n for n in ans.get("a11y", []) if isinstance(n, dict) and "role" in n]
            except HelperLost:
                self.check_alive()
        code, out = self.run_user("exec python3 -", timeout=timeout, stdin=_A11Y_SCRIPT.encode())
        nodes = []
        for line in out.decode(errors="replace").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and "role" in row:
                nodes.append(row)
        return nodes

    def read_file(self, path: str, max_bytes: int = 4 << 20) -> bytes | None:
        """A file's bytes (read as root), or None if it is not a regular file."""
        try:
            return self.sb.get_file(path, max_bytes=max_bytes)
        except SandboxError:
            if not self.sb.alive():
                raise
            return None

    def close(self) -> None:
        if self.helper is not None:
            self.helper.close()
        self.sb.close()


def desktop_pool(
    width: int, height: int, *, warm: int = 1, max_active: int = 8, image: str | None = None
) -> SandboxPool:
    """The process-wide warm pool of desktops of this screen size (detach it when done)."""

    def prepare(sb: DockerSandbox) -> None:
        start_session(sb, width, height)

    return SandboxPool.shared(
        image or desktop_image().tag,
        warm=warm,
        max_active=max_active,
        limits=DESKTOP_LIMITS,
        run_id="desktop",
        prepare=prepare,
        prepare_key=f"desktop-session-{width}x{height}",
    )
