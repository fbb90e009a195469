"""Dump the AT-SPI accessibility tree of the desktop's applications as JSON lines (runs inside the
desktop container as the desktop user, by ``python3 -``; standalone: it imports nothing from turngym).

Each line: ``{"depth", "role", "name", "text", "x", "y", "w", "h", "states", "app"}`` for the showing
nodes (bounds in screen pixels). Bounded: at most ``MAX_NODES`` nodes and ``MAX_DEPTH`` levels.
:func:`rows` yields them as dicts (the desktop helper, :mod:`turngym.sandboxes.desktop_helper`, runs it in
its own process); run as a script it prints them.
"""

import json
import sys

MAX_NODES = 1500
MAX_DEPTH = 40
KEEP_STATES = ("focused", "selected", "checked", "pressed", "editable", "sensitive", "expanded", "active")


def rows():
    """The showing nodes, one dict each (a dict with ``error`` if pyatspi is missing)."""
    try:
        import pyatspi
    except Exception as e:  # noqa: BLE001
        yield {"error": f"pyatspi unavailable: {e}"}
        return
    out = []
    desktop = pyatspi.Registry.getDesktop(0)
    count = [0]

    def walk(node, depth, app):
        if count[0] >= MAX_NODES or depth > MAX_DEPTH or node is None:
            return
        try:
            states = node.getState()
            showing = states.contains(pyatspi.STATE_SHOWING)
            if depth > 1 and not showing:
                return
            role = node.getRoleName()
            name = node.name or ""
            x = y = w = h = 0
            try:
                ext = node.queryComponent().getExtents(pyatspi.DESKTOP_COORDS)
                x, y, w, h = ext.x, ext.y, ext.width, ext.height
            except Exception:  # noqa: BLE001 - not a component
                pass
            text = ""
            try:
                t = node.queryText()
                text = t.getText(0, min(t.characterCount, 200))
            except Exception:  # noqa: BLE001 - no text interface
                pass
            kept = [s for s in KEEP_STATES if states.contains(getattr(pyatspi, "STATE_" + s.upper()))]
            if depth > 0:
                count[0] += 1
                row = {"depth": depth, "role": role, "name": name[:200], "text": text, "x": x, "y": y}
                row.update({"w": w, "h": h, "states": kept, "app": app})
                out.append(row)
            for i in range(min(node.childCount, 400)):
                walk(node.getChildAtIndex(i), depth + 1, app or name)
        except Exception:  # noqa: BLE001 - a node that went away while it was read
            return

    for i in range(desktop.childCount):
        app = desktop.getChildAtIndex(i)
        if app is not None:
            walk(app, 1, app.name or "")
    yield from out


def main():
    for row in rows():
        sys.stdout.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
