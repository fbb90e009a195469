"""The desktop sandbox: the xwd screenshot decoder, and a real desktop container's lock-down."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from turngym.sandboxes.desktop import decode_xwd
from turngym.sandboxes.desktop_helper import _CHORD, BadRequest, action_argv
from turngym.sandboxes.docker import SandboxError

_ACTION = st.dictionaries(
    st.sampled_from(["a", "x", "y", "button", "repeat", "chord", "text"]),
    st.one_of(
        st.integers(-5, 5000),
        st.booleans(),
        st.text(max_size=40),
        st.sampled_from(["move", "click", "down", "up", "key", "type", "exec", "ctrl+s", "a;id"]),
    ),
)


@given(_ACTION)
def test_the_helper_turns_only_its_vocabulary_into_xdotool_arguments(action):
    try:
        argv = action_argv(action, 640, 480)
    except BadRequest:
        return
    assert argv[0] in {"mousemove", "click", "mousedown", "mouseup", "key", "type"}
    assert all(isinstance(a, str) for a in argv)
    if argv[0] == "mousemove":
        assert 0 <= int(argv[1]) < 640 and 0 <= int(argv[2]) < 480
    if argv[0] == "key":
        assert _CHORD.fullmatch(argv[-1])
    if argv[0] == "type":  # the text comes after "--", never read as an option; no control characters
        assert argv[3] == "--" and all(ord(c) >= 32 and ord(c) != 127 for c in argv[4])


def _xwd(pixels: np.ndarray, bpp: int, pad: int = 0, ncolors: int = 0) -> bytes:
    """An xwd ZPixmap dump (LSB first, red in the high byte) of an RGB array, as the X server writes it."""
    h, w, _ = pixels.shape
    step = bpp // 8
    bpl = w * step + pad
    header = [100, 7, 2, 24, w, h, 0, 0, 32, 0, 32, bpp, bpl, 4, 0xFF0000, 0xFF00, 0xFF, 8, 256, ncolors]
    header += [w, h, 0, 0, 0]
    rows = []
    for r in range(h):
        row = bytearray()
        for c in range(w):
            red, green, blue = (int(v) for v in pixels[r, c])
            row += bytes([blue, green, red] + [0] * (step - 3))
        rows.append(bytes(row) + b"\0" * pad)
    return struct.pack(">25I", *header) + b"\0" * (12 * ncolors) + b"".join(rows)


@given(
    st.integers(1, 6),
    st.integers(1, 6),
    st.sampled_from([24, 32]),
    st.integers(0, 3),
    st.integers(0, 2),
    st.integers(0, 2**32 - 1),
)
def test_decode_xwd_gives_back_the_pixels(w, h, bpp, pad, ncolors, seed):
    pixels = np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    image = decode_xwd(_xwd(pixels, bpp, pad, ncolors))
    assert image.size == (w, h)
    assert (np.asarray(image) == pixels).all()


def test_decode_xwd_refuses_truncated_or_foreign_dumps():
    pixels = np.zeros((4, 4, 3), dtype=np.uint8)
    data = _xwd(pixels, 32)
    with pytest.raises(SandboxError, match="truncated"):
        decode_xwd(data[:-5])
    with pytest.raises(SandboxError, match="screenshot failed"):
        decode_xwd(b"Error: cannot open display")
    foreign = bytearray(data)
    foreign[44:48] = struct.pack(">I", 8)  # 8 bits per pixel: a palette visual
    with pytest.raises(SandboxError, match="unsupported"):
        decode_xwd(bytes(foreign))


@pytest.mark.docker
def test_desktop_container_is_locked_down_and_labelled():
    from turngym.sandboxes.desktop import DesktopSandbox
    from turngym.sandboxes.docker import LABEL_PID, managed_containers

    desk = DesktopSandbox.create(640, 480)
    try:
        attrs = desk.sb.container.attrs
        host = attrs["HostConfig"]
        assert host["NetworkMode"] == "none" and host["ReadonlyRootfs"] and host["PidsLimit"] > 0
        assert attrs["Config"]["Labels"][LABEL_PID].isdigit()
        assert desk.sb.id in {c.id for c in managed_containers(run_id="desktop")}
        assert desk.screenshot().size == (640, 480)
        # the helper: its XGetImage screenshot is the xwd program's, it runs as the user, and it refuses
        # anything outside its vocabulary (nothing runs)
        assert desk.observe(settle_s=0).image.tobytes() == desk.screenshot().tobytes()
        code, out = desk.run_user(f"ps -o user= -p {desk.helper.pid}")
        assert out.split() == [b"user"]
        for bad in (
            {"a": "exec", "cmd": "id"},
            {"a": "key", "chord": "a;id"},
            {"a": "move", "x": 640, "y": 0},
        ):
            ans, _ = desk.helper.request({"actions": [{"a": "move", "x": 1, "y": 1}, bad]}, 10)
            assert not ans["ok"] and "bad request" in ans["error"], ans
        ans, _ = desk.helper.request({"stat": ["/home/user/.bashrc", "/nonexistent"]}, 10)
        assert ans["ok"] and ans["stat"]["/nonexistent"] is None and ans["stat"]["/home/user/.bashrc"]
        code, out = desk.run_user("ps -o user= -C Xvfb,openbox | sort -u")
        assert out.split() == [b"user"]
        # started means the window manager manages the screen (an app's window mapped while openbox was
        # still starting never showed) and the accessibility registry runs (no app start activates it)
        code, out = desk.run_user("ls /tmp/.turngym-wm-ready && xprop -root _NET_SUPPORTING_WM_CHECK")
        assert code == 0 and b"window id" in out
        code, _ = desk.run_user("pgrep -f ^/usr/libexec/at-spi2-registryd")
        assert code == 0
        code, _ = desk.run_user("touch /usr/evil")
        assert code != 0
    finally:
        desk.close()
    assert not desk.sb.alive()
