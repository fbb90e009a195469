"""The MiniWoB++ task catalogue, read from the installed ``miniwob`` wheel (without importing it).

``html_dir()`` is the wheel's ``html`` folder (``miniwob/<task>.html`` plus ``core/`` and
``common/``). Each task's description, partial-reward notes and nondeterminism flag come from
the wheel's own sources (``envs/miniwob_envs.py`` docstrings and ``registration.py``); a task the
wheel has no environment class for (``button-delay``, ``chase-circle``, ``hover-shape``,
``moving-items``, ``simon-says``) takes its description from its page's instruction (the
``#query`` element's text, or the literal its script writes there).
"""

from __future__ import annotations

import ast
import functools
import html
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class MiniWoBTask:
    """One MiniWoB++ task page."""

    name: str
    description: str
    partial_reward: bool
    nondeterministic: bool

    def url(self, base: Path | None = None) -> str:
        return (base or html_dir()).joinpath("miniwob", f"{self.name}.html").as_uri()


@functools.cache
def package_dir() -> Path:
    spec = importlib.util.find_spec("miniwob")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the `miniwob` package is not installed: pip install 'turngym[web]'")
    return Path(next(iter(spec.submodule_search_locations)))


def html_dir() -> Path:
    return package_dir() / "html"


def _docstrings() -> dict[str, str]:
    """subdomain -> class docstring, parsed from ``miniwob/envs/miniwob_envs.py``."""
    path = package_dir() / "envs" / "miniwob_envs.py"
    if not path.is_file():
        return {}
    out = {}
    for node in ast.parse(path.read_text()).body:
        if not isinstance(node, ast.ClassDef):
            continue
        sub = None
        for stmt in node.body:
            if (
                isinstance(stmt, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "subdomain" for t in stmt.targets)
                and isinstance(stmt.value, ast.Constant)
            ):
                sub = stmt.value.value
        if sub:
            out[sub] = ast.get_docstring(node) or ""
    return out


def _nondeterministic() -> set[str]:
    """Task names the wheel registers with ``nondeterministic=True``."""
    path = package_dir() / "registration.py"
    if not path.is_file():
        return set()
    text = path.read_text()
    found = re.findall(r'id="miniwob/([\w.-]+)-v\d+",\s*entry_point="[^"]+",\s*nondeterministic=True', text)
    return set(found)


def _section(doc: str, title: str) -> str:
    m = re.search(rf"## {title}\s*\n(.*?)(?:\n## |\Z)", doc, re.S)
    return " ".join(m.group(1).split()) if m else ""


_QUERY_DIV = re.compile(r"<div\s+id=[\"']query[\"'][^>]*>(.*?)</div>", re.S | re.I)
_QUERY_SCRIPT = re.compile(
    r"""[\(]\s*['"]#query['"]\s*\)\s*\.\s*(?:html|text)\(\s*(['"])((?:(?!\1).)*)\1\s*\)"""
)


def page_instruction(page: Path) -> str:
    """The instruction a task page shows: its ``#query`` element's static text, else the first whole
    string literal its script writes into ``#query`` (``$('#query').html('...')``); tags stripped."""
    text = page.read_text(encoding="utf-8", errors="replace")
    found = [m.group(1) for m in _QUERY_DIV.finditer(text)]
    found += [m.group(2) for m in _QUERY_SCRIPT.finditer(text)]
    for raw in found:
        words = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", raw)).split())
        if words:
            return words
    return ""


@functools.cache
def all_tasks() -> dict[str, MiniWoBTask]:
    """Every task page in the wheel, by name (sorted)."""
    docs = _docstrings()
    nondet = _nondeterministic()
    out = {}
    for page in sorted((html_dir() / "miniwob").glob("*.html")):
        doc = docs.get(page.stem, "")
        out[page.stem] = MiniWoBTask(
            name=page.stem,
            description=_section(doc, "Description") or page_instruction(page),
            partial_reward="Partial reward" in doc,
            nondeterministic=page.stem in nondet,
        )
    return out


def get_task(name: str) -> MiniWoBTask:
    tasks = all_tasks()
    if name not in tasks:
        import difflib

        close = difflib.get_close_matches(name, list(tasks), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise KeyError(f"unknown MiniWoB task {name!r}.{hint} ({len(tasks)} tasks; see list_tasks())")
    return tasks[name]


def list_tasks(include_nondeterministic: bool = True) -> list[str]:
    return [n for n, t in all_tasks().items() if include_nondeterministic or not t.nondeterministic]


def resolve_tasks(spec: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """A task selection: one name, a list of names, ``"all"``, ``"deterministic"`` (default),
    or ``"expert"`` (the tasks the scripted expert solves)."""
    if spec is None or spec == "deterministic":
        return list_tasks(include_nondeterministic=False)
    if spec == "all":
        return list_tasks()
    if spec == "expert":
        from turngym.envs.web.expert import EXPERT_TASKS

        return list(EXPERT_TASKS)
    names = [spec] if isinstance(spec, str) else list(spec)
    if not names:
        raise ValueError("empty task list")
    for n in names:
        get_task(n)
    return names
