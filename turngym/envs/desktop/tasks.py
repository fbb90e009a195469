"""The ``gui-desktop`` tasks: 47 tasks over five real applications, generated from seeds.

Each :class:`DesktopTask` names its ``app``, what the episode starts (files written into the home
directory, the application launched), the instruction, a checker spec (read by
:mod:`turngym.envs.desktop.checkers` from the real state after the episode) and the scripted expert's
plan (:mod:`turngym.envs.desktop.expert`): abstract GUI steps, each rendered as the same tool calls
a policy would make. Content (words, numbers, file names, commands) comes from a per-task seeded RNG,
so the task list is the same on every machine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

HOME = "/home/user"
DOCS = f"{HOME}/Documents"
WORDS = (
    "amber", "basil", "cedar", "delta", "ember", "fjord", "garnet", "harbor", "indigo", "juniper",
    "kestrel", "lumen", "maple", "nectar", "orbit", "pepper", "quartz", "raven", "saffron", "tundra",
)  # fmt: skip

#: one expert step: (kind, *args); kinds: type, key, click_node(role, name), wait(seconds)
Step = tuple[Any, ...]


@dataclass(frozen=True)
class DesktopTask:
    """One task: its setup, instruction, checker and expert plan."""

    task_id: str
    app: str
    template: str
    instruction: str
    launch: tuple[str, ...]
    window_class: str
    check: dict[str, Any]
    plan: tuple[Step, ...]
    files: dict[str, str] = field(default_factory=dict)
    #: a sheet to create from CSV text with ssconvert before the app starts: (path, csv)
    sheet: tuple[str, str] | None = None

    def summary(self) -> dict[str, Any]:
        """The row of ``env.tasks``: id, app, template, instruction and checker kind."""
        row = {k: getattr(self, k) for k in ("task_id", "app", "template", "instruction")}
        return {**row, "checker": self.check["kind"]}


def _words(rng: np.random.Generator, n: int) -> list[str]:
    return [str(w) for w in rng.choice(WORDS, size=n, replace=False)]


def _save_as(path: str) -> tuple[Step, ...]:
    return (
        ("key", "ctrl+s"),
        ("wait", 1.0),
        ("type", path),
        ("wait", 0.5),
        ("click_node", "push button", "Save"),
    )


# ---------------------------------------------------------------- editor (mousepad)
def editor_new_file(i: int, rng: np.random.Generator) -> DesktopTask:
    w = _words(rng, 5)
    text = f"{w[0]} {w[1]} {w[2]}\n{w[3]} {w[4]}"
    path = f"{DOCS}/{w[0]}-{i}.txt"
    return DesktopTask(
        f"editor-new-file-{i}", "mousepad", "editor-new-file",
        f"In the text editor, write exactly this text (two lines):\n{text}\n"
        f"then save it as {path}.",
        ("mousepad",), "mousepad",
        {"kind": "file_text", "path": path, "text": text},
        (("type", text), *_save_as(path)),
    )  # fmt: skip


def editor_append(i: int, rng: np.random.Generator) -> DesktopTask:
    w = _words(rng, 6)
    path = f"{DOCS}/notes-{i}.txt"
    old = f"{w[0]}\n{w[1]}\n{w[2]}\n"
    line = f"{w[3]} {w[4]} {i}"
    return DesktopTask(
        f"editor-append-{i}", "mousepad", "editor-append",
        f"The editor shows {path}. Add the line \"{line}\" at the end of the file (after the last line) "
        "and save it.",
        ("mousepad", path), "mousepad",
        {"kind": "file_text", "path": path, "text": old + line},
        (("key", "ctrl+End"), ("type", line), ("key", "ctrl+s"), ("wait", 0.5)),
        files={path: old},
    )  # fmt: skip


# ---------------------------------------------------------------- spreadsheet (gnumeric)
_FUNCS = {"SUM": sum, "MAX": max, "MIN": min}


def sheet_column(i: int, rng: np.random.Generator) -> DesktopTask:
    col = "ABC"[i % 3]
    func = list(_FUNCS)[i % 3]
    n = 3 + i % 3
    values = [int(v) for v in rng.integers(2, 99, size=n)]
    path = f"{DOCS}/sheet-{i}.gnumeric"
    cells = {f"{col}{r + 1}": str(v) for r, v in enumerate(values)}
    fcell = f"{col}{n + 1}"
    cells[fcell] = str(_FUNCS[func](values))
    steps: list[Step] = [("key", "ctrl+Home")] + [("key", "Right")] * "ABC".index(col)
    for v in values:
        steps += [("type", str(v)), ("key", "Return")]
    steps += [("type", f"={func}({col}1:{col}{n})"), ("key", "Return"), ("key", "ctrl+s"), ("wait", 1.0)]
    listing = ", ".join(str(v) for v in values)
    return DesktopTask(
        f"sheet-{func.lower()}-{i}", "gnumeric", "sheet-column",
        f"The spreadsheet {path} is open. Enter the numbers {listing} into cells {col}1 to {col}{n} "
        f"(one per cell, top to bottom), put a formula computing their {func} in {fcell}, and save the file "
        "(same name, same format).",
        ("gnumeric", path), "gnumeric",
        {"kind": "sheet", "path": path, "cells": cells, "formula": {fcell: func}},
        tuple(steps),
        sheet=(path, "\n"),
    )  # fmt: skip


# ---------------------------------------------------------------- file manager (pcmanfm)
def _select(name: str) -> tuple[Step, ...]:
    stem = name.rsplit(".", 1)[0]
    return (("type", stem), ("wait", 0.4), ("key", "Escape"))


def _fm_files(rng: np.random.Generator, i: int) -> tuple[list[str], dict[str, str]]:
    names = [f"{w}.txt" for w in _words(rng, 4)]
    return names, {f"{DOCS}/{n}": f"{n} {i}\n" for n in names}


def _in_file_manager(
    task_id: str,
    what: str,
    plan: tuple[Step, ...],
    files: dict[str, str],
    *,
    present: list[str],
    absent: list[str],
    same: dict[str, str] | None = None,
) -> DesktopTask:
    """A pcmanfm task (showing ``DOCS``): do ``what``; the ``fs`` checker wants ``present`` / ``absent``
    paths and the ``same`` contents."""
    check = {"kind": "fs", "present": present, "absent": absent, "same": same or {}}
    return DesktopTask(task_id, "pcmanfm", task_id.rsplit("-", 1)[0], f"In the file manager (showing {DOCS}), {what}",
                       ("pcmanfm", DOCS), "pcmanfm", check, plan, files=files)  # fmt: skip


def files_rename(i: int, rng: np.random.Generator) -> DesktopTask:
    names, files = _fm_files(rng, i)
    src, dst = names[1], f"renamed-{i}.txt"
    plan = (*_select(src), ("key", "F2"), ("wait", 0.8), ("key", "ctrl+a"), ("type", dst), ("key", "Return"),
            ("wait", 0.5))  # fmt: skip
    return _in_file_manager(f"files-rename-{i}", f"rename {src} to {dst}.", plan, files,
                            present=[f"{DOCS}/{dst}"], absent=[f"{DOCS}/{src}"],
                            same={f"{DOCS}/{dst}": files[f"{DOCS}/{src}"]})  # fmt: skip


def files_delete(i: int, rng: np.random.Generator) -> DesktopTask:
    names, files = _fm_files(rng, i)
    victim = names[2]
    plan = (*_select(victim), ("key", "Delete"), ("wait", 0.8), ("key", "Return"), ("wait", 0.5))
    what = f"delete {victim} (moving it to the trash is fine). Leave the other files alone."
    return _in_file_manager(f"files-delete-{i}", what, plan, files,
                            present=[f"{DOCS}/{n}" for n in names if n != victim], absent=[f"{DOCS}/{victim}"])  # fmt: skip


def files_mkdir(i: int, rng: np.random.Generator) -> DesktopTask:
    names, files = _fm_files(rng, i)
    new = f"{_words(rng, 1)[0]}-folder-{i}"
    plan = (("key", "ctrl+shift+n"), ("wait", 0.8), ("key", "ctrl+a"), ("type", new), ("key", "Return"),
            ("wait", 0.5))  # fmt: skip
    return _in_file_manager(f"files-mkdir-{i}", f"create a new folder named {new} there.", plan, files,
                            present=[f"{DOCS}/{new}/"], absent=[])  # fmt: skip


def files_move(i: int, rng: np.random.Generator) -> DesktopTask:
    names, files = _fm_files(rng, i)
    box = f"{DOCS}/archive"
    files[f"{box}/.keep"] = ""
    moved = names[0]
    plan = (*_select(moved), ("key", "ctrl+x"), ("key", "ctrl+l"), ("type", box), ("key", "Return"),
            ("wait", 0.8), ("key", "ctrl+v"), ("wait", 0.8))  # fmt: skip
    return _in_file_manager(f"files-move-{i}", f"move {moved} into the folder {box}.", plan, files,
                            present=[f"{box}/{moved}"], absent=[f"{DOCS}/{moved}"],
                            same={f"{box}/{moved}": files[f"{DOCS}/{moved}"]})  # fmt: skip


# ---------------------------------------------------------------- terminal (xterm)
def _in_terminal(
    task_id: str, instruction: str, command: str, path: str, text: str, exact: bool = False
) -> DesktopTask:
    """An xterm task whose expert types one command line and whose checker reads ``path``."""
    template = task_id.rsplit("-", 1)[0]
    check = {"kind": "file_text", "path": path, "text": text, **({"exact": True} if exact else {})}
    plan = (("type", command + "\n"), ("wait", 0.5))
    return DesktopTask(task_id, "xterm", template, instruction, ("xterm",), "xterm", check, plan)


def term_output(i: int, rng: np.random.Generator) -> DesktopTask:
    a = int(rng.integers(2, 20))
    b = a + int(rng.integers(3, 9))
    out = f"{HOME}/out-{i}.txt"
    word = _words(rng, 1)[0]
    kind = i % 3
    if kind == 0:
        cmd, text = f"seq {a} {b}", "".join(f"{k}\n" for k in range(a, b + 1))
    elif kind == 1:
        cmd, text = f"echo {word} | tr a-z A-Z", word.upper() + "\n"
    else:
        cmd, text = f"expr {a} \\* {b}", f"{a * b}\n"
    instruction = f"In the terminal, run the command `{cmd}` and save its output (stdout) to the file {out}."
    return _in_terminal(f"term-output-{i}", instruction, f"{cmd} > {out}", out, text, exact=True)


def term_files(i: int, rng: np.random.Generator) -> DesktopTask:
    w = _words(rng, 3)
    d = f"{HOME}/project-{w[0]}"
    text = f"{w[1]} {w[2]}"
    instruction = (
        f"Using the terminal, create the directory {d} and in it a file named README whose only line is "
        f'"{text}".'
    )
    return _in_terminal(f"term-files-{i}", instruction, f"mkdir -p {d} && echo '{text}' > {d}/README",
                        f"{d}/README", text)  # fmt: skip


# ---------------------------------------------------------------- calculator (galculator)
def _calc_chunks(keys: str) -> list[str]:
    """``keys`` cut before each key already pressed in the current chunk: galculator drops a key pressed
    again within a fraction of a second, so a repeated key goes in a later turn."""
    chunks = [keys[0]]
    for ch in keys[1:]:
        if ch in chunks[-1]:
            chunks.append(ch)
        else:
            chunks[-1] += ch
    return chunks


def calc_clipboard(i: int, rng: np.random.Generator) -> DesktopTask:
    a, b = (int(v) for v in rng.integers(11, 99, size=2))
    op = "*+-"[i % 3]
    value = {"*": a * b, "+": a + b, "-": a - b}[op]
    return DesktopTask(
        f"calc-{i}", "galculator", "calc-clipboard",
        f"Use the calculator to compute {a} {op} {b}, then copy the result to the clipboard (Ctrl+C).",
        ("galculator",), "galculator",
        {"kind": "clipboard", "value": str(value)},
        (*(("type", chunk) for chunk in _calc_chunks(f"{a}{op}{b}=")), ("key", "ctrl+c"), ("wait", 0.3)),
    )  # fmt: skip


# ---------------------------------------------------------------- preferences (galculator, pcmanfm)
#: galculator's Preferences > Display > Modules Visibility check boxes and their keys in its config
_CALC_MODULES = {
    "Number base units": "display_module_number", "Angle base units": "display_module_angle",
    "Notation": "display_module_notation", "Arithmetic operation": "display_module_arith",
    "Open brackets": "display_module_open",
}  # fmt: skip
#: the Edit menu's last item is Preferences in both apps: open the menu, wrap up to it
_OPEN_PREFERENCES: tuple[Step, ...] = (
    ("key", "alt+e"),
    ("wait", 0.6),
    ("key", "Up"),
    ("key", "Return"),
    ("wait", 1.2),
)


def prefs_calc(i: int, rng: np.random.Generator) -> DesktopTask:
    names = list(_CALC_MODULES)
    name = names[i % len(names)]  # one module per task (the instruction's only varying part)
    conf = f"{HOME}/.config/galculator/galculator.conf"
    keep = {_CALC_MODULES[n]: "true" for n in names if n != name}
    return DesktopTask(
        f"prefs-calc-{i}", "galculator", "prefs-calc",
        f'In the calculator\'s preferences (Edit > Preferences, tab Display), hide the "{name}" module '
        "(untick it under Modules Visibility) and leave the other settings alone, close the dialog, then quit "
        "the calculator (Ctrl+Q) so that it saves its settings.",
        ("galculator",), "galculator",
        {"kind": "config", "path": conf, "section": "general", "key": _CALC_MODULES[name], "value": "false",
         "keep": keep},
        (*_OPEN_PREFERENCES, ("click_node", "check box", name), ("wait", 0.3),
         ("click_node", "push button", "Close"), ("wait", 0.5), ("key", "ctrl+q"), ("wait", 1.0)),
    )  # fmt: skip


#: pcmanfm's Preferences > General check boxes: (label, libfm.conf key, wanted value, verb, mnemonic)
_FM_SETTINGS = (
    ("Confirm before deleting files", "confirm_del", "0", "turn off", "alt+n"),
    ("Open files with single click", "single_click", "1", "turn on", "alt+o"),
    ("Don't ask options on launch executable file", "quick_exec", "1", "turn on", "alt+l"),
)


def prefs_files(i: int, rng: np.random.Generator) -> DesktopTask:
    label, key, value, verb, mnemonic = _FM_SETTINGS[i % len(_FM_SETTINGS)]
    conf = f"{HOME}/.config/libfm/libfm.conf"
    keep = {k: ("1" if v == "0" else "0") for _, k, v, _, _ in _FM_SETTINGS if k != key}
    return DesktopTask(
        f"prefs-files-{i}", "pcmanfm", "prefs-files",
        f'In the file manager\'s preferences (Edit > Preferences, General), {verb} "{label}", leave the '
        "other settings alone and close the dialog.",
        ("pcmanfm", DOCS), "pcmanfm",
        {"kind": "config", "path": conf, "section": "config", "key": key, "value": value, "keep": keep},
        (*_OPEN_PREFERENCES, ("key", mnemonic), ("wait", 0.4), ("key", "alt+c"), ("wait", 0.8)),
    )  # fmt: skip


TEMPLATES: list[tuple[Callable[[int, np.random.Generator], DesktopTask], int]] = [
    (editor_new_file, 4),
    (editor_append, 4),
    (sheet_column, 8),
    (files_rename, 2),
    (files_delete, 2),
    (files_mkdir, 2),
    (files_move, 2),
    (term_output, 5),
    (term_files, 3),
    (calc_clipboard, 8),
    (prefs_calc, 4),
    (prefs_files, 3),
]


def build_tasks(seed: int = 0) -> list[DesktopTask]:
    """All tasks, in a fixed order; each task's content comes from ``(seed, template, index)``."""
    tasks = []
    for t, (make, count) in enumerate(TEMPLATES):
        for i in range(count):
            tasks.append(make(i, np.random.default_rng([seed, t, i])))
    ids = [task.task_id for task in tasks]
    if len(set(ids)) != len(ids):
        raise AssertionError("duplicate desktop task ids")
    return tasks
