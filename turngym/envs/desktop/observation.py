"""What a ``gui-desktop`` agent sees: the screenshot (resized to the configured size), and optionally the
accessibility tree as an element list (``[id] role "name" ...`` with bounds in screenshot pixels and
states) and a set-of-marks overlay (each element's box and id drawn on the screenshot)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

#: roles an agent acts on, plus any named node, make the element list
INTERACTIVE = frozenset(
    {
        "push button", "toggle button", "check box", "radio button", "menu", "menu item", "check menu item",
        "radio menu item", "text", "entry", "password text", "combo box", "page tab", "list item", "table cell",
        "icon", "spin button", "slider", "link", "tree item", "label", "frame", "dialog", "alert",
    }
)  # fmt: skip
MAX_ELEMENTS = 150


def element_list(nodes: list[dict[str, Any]], screen: tuple[int, int]) -> list[dict[str, Any]]:
    """The nodes worth listing: on screen, with a size, interactive or named; at most ``MAX_ELEMENTS``."""
    w, h = screen
    out = []
    for n in nodes:
        if n.get("w", 0) <= 0 or n.get("h", 0) <= 0:
            continue
        cx, cy = n["x"] + n["w"] / 2, n["y"] + n["h"] / 2
        if not (0 <= cx < w and 0 <= cy < h):
            continue
        if n["role"] in INTERACTIVE or n.get("name"):
            out.append(n)
        if len(out) >= MAX_ELEMENTS:
            break
    return out


def elements_text(elements: list[dict[str, Any]], scale: float) -> str:
    """The element list as text, bounds in screenshot pixels."""
    lines = []
    for i, n in enumerate(elements):
        x, y, w, h = (round(n[k] / scale) for k in ("x", "y", "w", "h"))
        name = f' "{n["name"][:80]}"' if n.get("name") else ""
        text = f" text={n['text'][:60]!r}" if n.get("text") and n["text"] != n.get("name") else ""
        states = f" [{', '.join(n['states'])}]" if n.get("states") else ""
        lines.append(f"[{i}] {n['role']}{name}{text} @({x},{y},{w},{h}){states}")
    return "\n".join(lines) if lines else "(no accessible elements)"


def draw_marks(image: Any, elements: list[dict[str, Any]], scale: float) -> Any:
    """A copy of ``image`` with each element's box and id drawn on it (set-of-marks)."""
    from PIL import ImageDraw

    out = image.copy()
    draw = ImageDraw.Draw(out)
    for i, n in enumerate(elements):
        box = [n["x"] / scale, n["y"] / scale, (n["x"] + n["w"]) / scale - 1, (n["y"] + n["h"]) / scale - 1]
        draw.rectangle(box, outline=(255, 0, 64))
        label = str(i)
        tx, ty = box[0] + 1, box[1] + 1
        draw.rectangle([tx, ty, tx + 6 * len(label) + 2, ty + 10], fill=(255, 0, 64))
        draw.text((tx + 1, ty - 1), label, fill=(255, 255, 255))
    return out


def tree_digest(nodes: list[dict[str, Any]]) -> str:
    """A hash of the accessibility tree (roles, names, text, bounds, states)."""
    rows = [
        [n.get(k) for k in ("depth", "role", "name", "text", "x", "y", "w", "h", "states")] for n in nodes
    ]
    return hashlib.sha1(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16]


def image_digest(image: Any) -> str:
    return hashlib.sha1(image.tobytes()).hexdigest()[:16]
