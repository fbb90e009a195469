"""Checkers of the ``gui-desktop`` tasks: they read the real state of the desktop, never the agent's claim.

* ``file_text``: the saved file read back (exact text, a trailing newline aside unless ``exact``);
* ``sheet``: the saved gnumeric workbook, recalculated by ``ssconvert`` to CSV (values) and read as XML
  (that the formula cell holds a formula with the named function);
* ``fs``: the file system (paths present / absent, file contents kept);
* ``clipboard``: the X clipboard's text (``xclip``);
* ``config``: an application's saved settings file (``key=value`` lines under ``[section]`` headers):
  the asked setting has the wanted value and the ``keep`` settings theirs.

Each returns a :class:`Verdict`: ``success`` and ``progress`` in [0, 1] (the partial credit the env
pays turn by turn: file exists, cells right so far). Root-side commands never carry agent text; a
workbook is converted as ``nobody`` in a directory the desktop user cannot read.
"""

from __future__ import annotations

import csv
import difflib
import gzip
import hashlib
import io
import re
import shlex
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any

from turngym.sandboxes.desktop import DesktopSandbox


@dataclass(frozen=True)
class Verdict:
    success: bool
    progress: float
    detail: str


def _norm(text: str, exact: bool) -> str:
    return text if exact else text.rstrip("\n")


def check_file_text(desk: DesktopSandbox, spec: dict[str, Any], cache: dict[str, Any]) -> Verdict:
    data = desk.read_file(spec["path"])
    if data is None:
        return Verdict(False, 0.0, f"{spec['path']} does not exist")
    got = _norm(data.decode("utf-8", errors="replace"), bool(spec.get("exact")))
    want = _norm(spec["text"], bool(spec.get("exact")))
    if got == want:
        return Verdict(True, 1.0, "file content matches")
    ratio = difflib.SequenceMatcher(None, got[:4000], want).ratio()
    return Verdict(
        False, 0.3 + 0.6 * ratio, f"{spec['path']} exists but its content differs (similarity {ratio:.2f})"
    )


_CONVERT = """set -e
rm -rf /tmp/.turngym-check && mkdir -m 711 /tmp/.turngym-check && mkdir -m 700 /tmp/.turngym-check/out
cat > /tmp/.turngym-check/in.gnumeric && chmod 644 /tmp/.turngym-check/in.gnumeric
chown 65534:65534 /tmp/.turngym-check/out
cd /tmp/.turngym-check/out
setpriv --reuid=65534 --regid=65534 --clear-groups env -i HOME=/tmp/.turngym-check/out PATH=/usr/bin:/bin \
  timeout 30 ssconvert /tmp/.turngym-check/in.gnumeric /tmp/.turngym-check/out/out.csv >/dev/null 2>&1
cat /tmp/.turngym-check/out/out.csv
"""


def _cell_name(row: int, col: int) -> str:
    return f"{chr(ord('A') + col)}{row + 1}" if col < 26 else f"C{col}R{row}"


def read_sheet(
    desk: DesktopSandbox, path: str, cache: dict[str, Any]
) -> tuple[dict[str, str], dict[str, str]] | None:
    """``(values, formulas)`` of the workbook's first sheet (cell name -> text), or None if missing.
    Cached by the file's hash: a workbook is only converted again after it was saved again."""
    raw = desk.read_file(path)
    if raw is None:
        return None
    digest = hashlib.sha256(raw).hexdigest()
    if cache.get("sheet_hash") == digest:
        return cache["sheet"]
    formulas: dict[str, str] = {}
    cols: list[int] = []
    rows: list[int] = []
    try:
        root = ET.fromstring(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        sheet = next((el for el in root.iter() if el.tag.endswith("}Sheet")), None)
        for el in sheet.iter() if sheet is not None else ():
            if el.tag.endswith("}Cell"):
                r, c = int(el.get("Row", 0)), int(el.get("Col", 0))
                rows.append(r)
                cols.append(c)
                if (el.text or "").startswith("="):
                    formulas[_cell_name(r, c)] = el.text or ""
    except (OSError, EOFError, ET.ParseError, ValueError):
        pass
    # ssconvert writes the used range: its first row and column are the first used ones
    r0, c0 = (min(rows), min(cols)) if rows else (0, 0)
    code, out = desk.run_root(_CONVERT, stdin=raw, timeout=60)
    values: dict[str, str] = {}
    if code == 0:
        for r, row in enumerate(csv.reader(io.StringIO(out.decode("utf-8", errors="replace")))):
            for c, v in enumerate(row):
                if v != "":
                    values[_cell_name(r + r0, c + c0)] = v
    cache["sheet_hash"], cache["sheet"] = digest, (values, formulas)
    return values, formulas


def check_sheet(desk: DesktopSandbox, spec: dict[str, Any], cache: dict[str, Any]) -> Verdict:
    sheet = read_sheet(desk, spec["path"], cache)
    if sheet is None:
        return Verdict(False, 0.0, f"{spec['path']} does not exist")
    values, formulas = sheet
    want: dict[str, str] = spec["cells"]
    right = [k for k, v in want.items() if _same_number(values.get(k), v)]
    formula_ok = all(
        re.match(rf"=\s*{func}\s*\(", formulas.get(cell, ""), re.IGNORECASE)
        for cell, func in spec["formula"].items()
    )
    progress = 0.2 + 0.7 * len(right) / len(want) + (0.1 if formula_ok else 0.0)
    if len(right) == len(want) and formula_ok:
        return Verdict(True, 1.0, "all cells and the formula are right")
    wrong = sorted(set(want) - set(right))
    return Verdict(
        False, min(progress, 0.95), f"cells wrong: {', '.join(wrong) or 'none'}; formula ok: {formula_ok}"
    )


def _same_number(got: str | None, want: str) -> bool:
    if got is None:
        return False
    try:
        return abs(float(got) - float(want)) < 1e-9
    except ValueError:
        return got.strip() == want


def check_fs(desk: DesktopSandbox, spec: dict[str, Any], cache: dict[str, Any]) -> Verdict:
    parts = []
    for p in spec["present"]:
        test = "-d" if p.endswith("/") else "-f"
        parts.append(f"[ {test} {shlex.quote(p.rstrip('/'))} ] && echo Y || echo N")
    for p in spec["absent"]:
        parts.append(f"[ -e {shlex.quote(p)} ] && echo N || echo Y")
    code, out = desk.run_root("; ".join(parts) or "true", timeout=20)
    flags = out.decode().split()
    if code != 0 or len(flags) != len(parts):
        return Verdict(False, 0.0, "could not read the file system")
    same = []
    for path, content in spec["same"].items():
        data = desk.read_file(path)
        same.append(data is not None and data.decode(errors="replace") == content)
    checks = [f == "Y" for f in flags] + same
    ok = sum(checks)
    if all(checks):
        return Verdict(True, 1.0, "the file system is as asked")
    return Verdict(False, 0.8 * ok / len(checks), f"{len(checks) - ok} of {len(checks)} file checks fail")


def check_clipboard(desk: DesktopSandbox, spec: dict[str, Any], cache: dict[str, Any]) -> Verdict:
    code, out = desk.run_user("timeout 3 xclip -o -selection clipboard 2>/dev/null", timeout=10)
    return clipboard_verdict(out.decode(errors="replace") if code == 0 else "", spec)


def clipboard_verdict(text: str, spec: dict[str, Any]) -> Verdict:
    """The ``clipboard`` verdict for the clipboard's text."""
    got = text.strip()
    if _same_number(got, spec["value"]):
        return Verdict(True, 1.0, "the clipboard holds the result")
    return Verdict(False, 0.0, f"the clipboard holds {got[:40]!r}" if got else "the clipboard is empty")


def config_values(text: str, section: str) -> dict[str, str]:
    """The ``key=value`` settings under ``[section]`` of an INI-style settings file (quotes kept)."""
    values: dict[str, str] = {}
    current = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1].strip()
        elif current == section and "=" in line and not line.startswith(("#", ";")):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def check_config(desk: DesktopSandbox, spec: dict[str, Any], cache: dict[str, Any]) -> Verdict:
    data = desk.read_file(spec["path"])
    if data is None:
        return Verdict(False, 0.0, f"{spec['path']} does not exist (the app saves its settings later)")
    values = config_values(data.decode("utf-8", errors="replace"), spec["section"])
    got = values.get(spec["key"])
    changed = sorted(k for k, v in spec.get("keep", {}).items() if values.get(k, v) != v)
    if got != spec["value"]:
        return Verdict(False, 0.0, f"{spec['key']} is {got!r}, not {spec['value']!r}")
    if changed:
        return Verdict(False, 0.5, f"{spec['key']} is right but other settings changed: {', '.join(changed)}")
    return Verdict(True, 1.0, f"{spec['key']} = {got} saved")


CHECKERS = {
    "file_text": check_file_text,
    "sheet": check_sheet,
    "fs": check_fs,
    "clipboard": check_clipboard,
    "config": check_config,
}


def watched_paths(spec: dict[str, Any]) -> list[str]:
    """The paths whose ``stat`` tells whether the checker's reading can have changed since the last turn."""
    if spec["kind"] in ("file_text", "sheet", "config"):
        return [spec["path"]]
    if spec["kind"] == "fs":
        return [*spec["present"], *spec["absent"], *spec["same"]]
    return []


def check(desk: DesktopSandbox, spec: dict[str, Any], cache: dict[str, Any]) -> Verdict:
    """Run the task's checker on the live desktop."""
    return CHECKERS[spec["kind"]](desk, spec, cache)
