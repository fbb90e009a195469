"""The pruned DOM snapshot: nodes with stable ids and boxes, and its text rendering.

A snapshot comes from ``snapshot.js`` (one ``page.evaluate``). Its text form is what a
DOM agent reads, one element per line, indented by depth::

    [3] button "Submit"
    [5] textbox "Username" value="" focused
    [7] checkbox "HF2" checked=false
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Node:
    """One element (or a run of loose text when ``id`` is None). ``box`` is (x, y, w, h) in CSS px."""

    id: int | None
    depth: int
    role: str
    tag: str
    name: str = ""
    box: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    dom_id: str = ""
    cls: str = ""
    type: str = ""
    value: str | None = None
    checked: bool | None = None
    selected: bool | None = None
    disabled: bool = False
    focused: bool = False
    bg: str | None = None
    fill: str | None = None
    point: tuple[float, float] | None = None
    covered: bool = False

    @classmethod
    def from_js(cls, d: dict[str, Any]) -> Node:
        return cls(
            id=d.get("id"),
            depth=int(d.get("depth", 0)),
            role=str(d.get("role", "")),
            tag=str(d.get("tag", "")),
            name=str(d.get("name") or ""),
            box=tuple(float(v) for v in d.get("box", (0, 0, 0, 0))),  # type: ignore[arg-type]
            dom_id=str(d.get("domId") or ""),
            cls=str(d.get("cls") or ""),
            type=str(d.get("type") or ""),
            value=d.get("value"),
            checked=d.get("checked"),
            selected=d.get("selected"),
            disabled=bool(d.get("disabled", False)),
            focused=bool(d.get("focused", False)),
            bg=d.get("bg"),
            fill=d.get("fill"),
            point=tuple(d["pt"]) if d.get("pt") else None,  # type: ignore[arg-type]
            covered=bool(d.get("covered", False)),
        )

    @property
    def center(self) -> tuple[float, float]:
        x, y, w, h = self.box
        return x + w / 2, y + h / 2

    @property
    def click_point(self) -> tuple[float, float]:
        """Where a click reaches this element: its center, or an uncovered point if the center is covered."""
        return self.point or self.center

    def contains(self, x: float, y: float) -> bool:
        bx, by, bw, bh = self.box
        return bx <= x < bx + bw and by <= y < by + bh

    def line(self, with_boxes: bool = False) -> str:
        head = f"[{self.id}] " if self.id is not None else ""
        parts = [head + (self.role if self.role != "text" else "StaticText")]
        if self.type:
            parts.append(f"type={self.type}")
        if self.name:
            parts.append(_quote(self.name))
        if self.value is not None:
            parts.append(f"value={_quote(self.value)}")
        if self.checked is not None:
            parts.append(f"checked={'true' if self.checked else 'false'}")
        if self.selected:
            parts.append("selected")
        if self.disabled:
            parts.append("disabled")
        if self.focused:
            parts.append("focused")
        if self.covered:
            parts.append("covered")
        if self.dom_id and self.role not in ("text",):
            parts.append(f"#{self.dom_id}")
        if self.cls and (not self.name or "ui-state-active" in self.cls):
            parts.append(f".{self.cls.replace(' ', '.')}")
        if self.bg:
            parts.append(f"bg={self.bg}")
        if self.fill:
            parts.append(f"fill={self.fill}")
        if with_boxes:
            x, y, w, h = self.box
            parts.append(f"box=({x:.0f},{y:.0f},{w:.0f},{h:.0f})")
        return "  " * self.depth + " ".join(parts)


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass
class Snapshot:
    nodes: list[Node] = field(default_factory=list)
    focused: int | None = None

    @classmethod
    def from_js(cls, data: dict[str, Any]) -> Snapshot:
        return cls(nodes=[Node.from_js(n) for n in data.get("nodes", [])], focused=data.get("focused"))

    def text(self, with_boxes: bool = False, max_chars: int = 12_000) -> str:
        lines = [n.line(with_boxes) for n in self.nodes]
        out = "\n".join(lines)
        if len(out) > max_chars:
            out = out[:max_chars] + f"\n[... {len(out) - max_chars} characters of the page cut ...]"
        return out or "(the page shows nothing)"

    def key(self) -> str:
        """Hash of the pruned DOM (ids, roles, names, values, states; no boxes)."""
        return hashlib.sha1(self.text().encode()).hexdigest()[:16]

    def by_id(self, bid: int) -> Node | None:
        for n in self.nodes:
            if n.id == bid:
                return n
        return None

    def find(self, *, role: str | None = None, name: str | None = None, tag: str | None = None) -> list[Node]:
        """Nodes matching every given field (``name`` compared case-sensitively, whitespace-trimmed)."""
        out = []
        for n in self.nodes:
            if n.id is None:
                continue
            if role is not None and n.role != role:
                continue
            if tag is not None and n.tag != tag:
                continue
            if name is not None and n.name.strip() != name.strip():
                continue
            out.append(n)
        return out
