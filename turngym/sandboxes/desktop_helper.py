"""The desktop's input/screen helper: one long-lived process inside the desktop container, as the user.

Standalone (the host starts it with ``python3 -c`` through one attached ``docker exec``; it imports
nothing from turngym), so a step of ``gui-desktop`` is one round trip on an open stream instead of
several ``docker exec`` process starts. Requests arrive on stdin as ``<4-byte big-endian length><JSON>``;
each answer is ``<4-byte length><JSON header>`` followed by ``header["blob"]`` bytes (the screenshot, an
``xwd`` dump, or nothing). End of stdin ends the helper.

The helper runs no client-chosen command: a request names actions of a fixed vocabulary
(:func:`action_argv`: move, click, button down/up, key chord, type) whose arguments are validated
(points on the screen, key names of letters, digits and ``_``, text capped, no control characters)
and turned into ``xdotool`` argument lists here; the rest of a request are flags (settle times, which
application to watch, screenshot / accessibility tree / clipboard wanted, paths to ``stat``), also
validated and capped. The host imports :func:`action_argv` too, so the ``docker exec`` fallback path
speaks the same vocabulary.
"""

import json
import os
import re
import struct
import subprocess
import sys
import time

MAX_TEXT = 2000
MAX_ACTIONS = 64
MAX_REQUEST = 1 << 20
MAX_SHOT = 64 << 20
MAX_PATHS = 32
_CHORD = re.compile(r"[A-Za-z0-9_]{1,32}(\+[A-Za-z0-9_]{1,32}){0,5}")
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class BadRequest(Exception):
    """A request outside the vocabulary; answered as an error, nothing is run."""


def _int(action, key, lo, hi):
    v = action.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise BadRequest(f"{key} must be an integer in [{lo}, {hi}]")
    return v


def action_argv(action, width, height):
    """One action of the vocabulary -> the ``xdotool`` arguments; ``BadRequest`` if it is not one."""
    if not isinstance(action, dict):
        raise BadRequest("an action is an object")
    kind = action.get("a")
    if kind == "move":
        x, y = _int(action, "x", 0, width - 1), _int(action, "y", 0, height - 1)
        return ["mousemove", str(x), str(y)]  # no --sync: it waits forever when the mouse is there already
    if kind == "click":
        return ["click", "--repeat", str(_int(action, "repeat", 1, 50)), str(_int(action, "button", 1, 7))]
    if kind in ("down", "up"):
        return ["mouse" + kind, str(_int(action, "button", 1, 3))]
    if kind == "key":
        chord = action.get("chord")
        if not isinstance(chord, str) or not _CHORD.fullmatch(chord):
            raise BadRequest("a key chord is key names joined by +")
        return ["key", "--clearmodifiers", chord]
    if kind == "type":
        text = action.get("text")
        if not isinstance(text, str) or not 0 < len(text) <= MAX_TEXT:
            raise BadRequest(f"typed text is 1 to {MAX_TEXT} characters")
        if any(ord(c) < 32 or ord(c) == 127 for c in text):
            raise BadRequest("typed text has no control characters (send Return as a key)")
        return ["type", "--delay", "12", "--", text]
    raise BadRequest(f"unknown action {kind!r}")


def _run(argv, timeout=15.0, max_bytes=1 << 16):
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, b""
    except OSError as e:
        return 127, str(e).encode()
    return p.returncode, (p.stdout + p.stderr)[:max_bytes] if p.returncode else p.stdout[:max_bytes]


def _x_alive():
    return _run(["xdotool", "getdisplaygeometry"], timeout=5)[0] == 0


class _Screen:
    """Screenshots through Xlib's ``XGetImage`` (ctypes, one connection kept open), as ``xwd`` dumps;
    the ``xwd`` program if Xlib cannot be loaded. Xlib ends the process if the X server goes away."""

    def __init__(self):
        import ctypes

        class XImage(ctypes.Structure):
            _fields_ = (
                [(n, ctypes.c_int) for n in ("width", "height", "xoffset", "format")]
                + [("data", ctypes.c_void_p)]
                + [
                    (n, ctypes.c_int)
                    for n in (
                        "byte_order",
                        "bitmap_unit",
                        "bitmap_bit_order",
                        "bitmap_pad",
                        "depth",
                        "bytes_per_line",
                        "bits_per_pixel",
                    )
                ]
                + [(n, ctypes.c_ulong) for n in ("red_mask", "green_mask", "blue_mask")]
            )

        self.ct, self.x = ctypes, None
        try:
            x = ctypes.CDLL("libX11.so.6")
            x.XOpenDisplay.restype, x.XOpenDisplay.argtypes = ctypes.c_void_p, [ctypes.c_char_p]
            x.XDefaultRootWindow.restype, x.XDefaultRootWindow.argtypes = ctypes.c_ulong, [ctypes.c_void_p]
            x.XGetImage.restype = ctypes.POINTER(XImage)
            x.XGetImage.argtypes = [
                ctypes.c_void_p,
                ctypes.c_ulong,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_uint,
                ctypes.c_uint,
                ctypes.c_ulong,
                ctypes.c_int,
            ]
            x.XDestroyImage.argtypes = [ctypes.POINTER(XImage)]
            self.dpy = x.XOpenDisplay(None)
            if self.dpy:
                self.root, self.x = x.XDefaultRootWindow(self.dpy), x
        except (OSError, AttributeError):
            self.x = None

    def shot(self, width, height):
        if self.x is None:
            try:
                p = subprocess.run(
                    ["xwd", "-root", "-silent"], stdin=subprocess.DEVNULL, capture_output=True, timeout=15
                )
            except subprocess.TimeoutExpired:
                return None
            return p.stdout[:MAX_SHOT] if p.returncode == 0 else None
        img = self.x.XGetImage(self.dpy, self.root, 0, 0, width, height, 0xFFFFFFFF, 2)  # ZPixmap
        if not img:
            return None
        try:
            i = img.contents
            data = self.ct.string_at(i.data, i.bytes_per_line * i.height)
            header = struct.pack(
                ">25I",
                100,
                7,
                2,
                i.depth,
                i.width,
                i.height,
                0,
                i.byte_order,
                i.bitmap_unit,
                i.bitmap_bit_order,
                i.bitmap_pad,
                i.bits_per_pixel,
                i.bytes_per_line,
                4,
                i.red_mask,
                i.green_mask,
                i.blue_mask,
                8,
                0,
                0,
                i.width,
                i.height,
                0,
                0,
                0,
            )
        finally:
            self.x.XDestroyImage(img)
        return header + data


_SCREEN = []
_SIZE = [0, 0]


def _shot():
    if not _SCREEN:
        _SCREEN.append(_Screen())
    return _SCREEN[0].shot(*_SIZE)


def _running(name):
    me = os.getuid()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
            if comm == name[:15] and os.stat(f"/proc/{pid}").st_uid == me:
                return True
        except OSError:
            continue
    return False


def _app_state(name, window_class, grace):
    """``exited`` / ``running`` like the host's ``app_state``: without a window the app gets ``grace``
    seconds to finish exiting."""
    end = time.monotonic() + grace
    while True:
        if not _running(name):
            return "exited"
        if _run(["xdotool", "search", "--onlyvisible", "--class", window_class], timeout=5)[0] == 0:
            return "running"
        if time.monotonic() >= end:
            return "running"
        time.sleep(0.1)


def _settled_shot(settle, app=None):
    """The screenshot once two captures ``quiet`` seconds apart agree (after ``min``, at most ``max``),
    then the app's state (``app``: name, window class, grace seconds)."""
    lo, quiet, hi = (
        min(max(float(settle.get(k, d)), 0.0), 10.0)
        for k, d in (("min", 0.03), ("quiet", 0.05), ("max", 0.3))
    )
    start = time.monotonic()
    time.sleep(min(lo, hi))
    last = _shot()
    while last is not None and time.monotonic() - start < hi:
        time.sleep(quiet)
        cur = _shot()
        if cur is None or cur == last:
            break
        last = cur
    if last is None or app is None:
        return last, None
    state = _app_state(*app)
    return (_shot() or last) if state == "exited" else last, state


def _stat(paths):
    out = {}
    for p in paths[:MAX_PATHS]:
        if not isinstance(p, str) or len(p) > 4096:
            continue
        try:
            s = os.lstat(p.rstrip("/") or "/")
            out[p] = [s.st_mode, s.st_size, s.st_mtime_ns, s.st_ino]
        except OSError:
            out[p] = None
    return out


_A11Y = {}


def _a11y(source):
    if "rows" not in _A11Y:
        ns = {"__name__": "turngym_a11y"}
        exec(compile(source, "desktop_a11y_dump", "exec"), ns)  # the host's own dump code, not agent text
        _A11Y["rows"] = ns["rows"]
    try:
        return list(_A11Y["rows"]())
    except Exception:  # noqa: BLE001 - AT-SPI failing: an empty tree, like the one-shot dump
        return []


def handle(req, width, height, a11y_source):
    """One request -> (answer header, blob)."""
    actions = req.get("actions") or []
    if not isinstance(actions, list) or len(actions) > MAX_ACTIONS:
        raise BadRequest(f"at most {MAX_ACTIONS} actions")
    argvs = [action_argv(a, width, height) for a in actions]  # all validated before any runs
    ans = {"ok": True}
    for argv in argvs:
        code, out = _run(["xdotool", *argv], timeout=15.0 + 0.03 * sum(len(a) for a in argv))
        text = out.decode(errors="replace")
        if code != 0 or "No such key name" in text or "Invalid" in text:
            ans.update(ok=False, error=f"xdotool failed ({code}): {text.strip()[:500]}")
            ans["state"] = "running" if _x_alive() else "dead"
            return ans, b""
    blob = b""
    t0 = time.monotonic()
    if req.get("observe"):
        settle = req.get("settle") if isinstance(req.get("settle"), dict) else {}
        app = req.get("app")
        watch = None
        if isinstance(app, dict):
            name, cls = str(app.get("name", "")), str(app.get("class", ""))
            if not (_NAME.fullmatch(name) and _NAME.fullmatch(cls)):
                raise BadRequest("bad application name or window class")
            watch = (name, cls, min(float(app.get("grace", 3.0)), 10.0))
        shot, state = _settled_shot(settle, watch)
        ans["settle_ms"] = round(1000 * (time.monotonic() - t0), 1)
        if shot is None:
            ans["state"] = "running" if _x_alive() else "dead"
            if ans["state"] == "dead":
                return ans, b""
            raise BadRequest("the screenshot failed")
        if state is not None:
            ans["state"] = state
        blob = shot
    if req.get("a11y"):
        ans["a11y"] = _a11y(a11y_source)
    if req.get("clipboard"):
        code, out = _run(
            ["timeout", "3", "xclip", "-o", "-selection", "clipboard"], timeout=5, max_bytes=4096
        )
        ans["clipboard"] = out.decode(errors="replace") if code == 0 else ""
    paths = req.get("stat") or []
    if isinstance(paths, list) and paths:
        ans["stat"] = _stat(paths)
    ans["ms"] = round(1000 * (time.monotonic() - t0), 1)
    ans["blob"] = len(blob)
    return ans, blob


def _read_exactly(f, n):
    buf = b""
    while len(buf) < n:
        chunk = f.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def main(width, height, a11y_source):
    inp, out = sys.stdin.buffer, sys.stdout.buffer

    def send(header, blob=b""):
        body = json.dumps(header).encode()
        out.write(struct.pack(">I", len(body)) + body + blob)
        out.flush()

    _SIZE[:] = [width, height]
    send({"hello": True, "pid": os.getpid()})
    while True:
        head = _read_exactly(inp, 4)
        if head is None:
            return
        (n,) = struct.unpack(">I", head)
        if n > MAX_REQUEST:
            send({"ok": False, "error": "request too large", "fatal": True})
            return
        body = _read_exactly(inp, n)
        if body is None:
            return
        req = {}
        try:
            req = json.loads(body)
            if not isinstance(req, dict):
                raise BadRequest("a request is an object")
            ans, blob = handle(req, width, height, a11y_source)
        except (BadRequest, ValueError, TypeError) as e:
            ans, blob = {"ok": False, "error": f"bad request: {e}", "blob": 0}, b""
        ans["id"] = req.get("id") if isinstance(req, dict) else None
        send(ans, blob)
