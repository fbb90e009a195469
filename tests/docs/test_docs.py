"""Docs cannot go stale: every Python snippet in README.md and docs/ runs, every `turngym ...`
line of a bash snippet runs (other lines — make, pip — are set-up, not run here), and
docs/cli.md equals the reference generated from the typer app.

A snippet that needs a component names it after the language in its fence, e.g.
```` ```python docker slow ````: the words are pytest markers (``MARKS``), so the snippet skips
cleanly where the component is missing (see tests/conftest.py) and ``-m "not slow"`` leaves it out.
Snippets in ``text`` (or unlabelled) fences are never run."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^([ \t]*)```(\w+)([^\n]*)\n(.*?)^[ \t]*```", re.DOTALL | re.MULTILINE)
GENERATED = {ROOT / "docs" / "cli.md", ROOT / "docs" / "results.md"}
#: markers a fence may carry after its language (those of tests/conftest.py)
MARKS = frozenset({"slow", "docker", "browser", "vllm", "gpu", "pretrained"})


def snippets(lang: str) -> list[tuple[str, str, tuple[str, ...]]]:
    """``(where, code, marks)`` of every ``lang`` fence in the docs (generated pages excepted)."""
    out = []
    for doc in DOCS:
        if doc in GENERATED:
            continue
        for i, m in enumerate(FENCE.finditer(doc.read_text(encoding="utf-8"))):
            if m.group(2) == lang:
                where = f"{doc.relative_to(ROOT)}#{i}"
                marks = tuple(m.group(3).split())
                unknown = set(marks) - MARKS
                if unknown:
                    raise ValueError(
                        f"{where}: unknown fence marks {sorted(unknown)}; known: {sorted(MARKS)}"
                    )
                out.append((where, textwrap.dedent(m.group(4)), marks))
    return out


def params(items: list[tuple[str, str, tuple[str, ...]]]) -> list:
    return [pytest.param(w, x, marks=[getattr(pytest.mark, k) for k in marks], id=w) for w, x, marks in items]


@pytest.mark.parametrize(("where", "code"), params(snippets("python")))
def test_python_snippet_runs(where, code, tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, f"{where} failed:\n{out.stderr[-3000:]}"


def turngym_lines() -> list:
    lines = []
    for where, code, marks in snippets("bash"):
        for line in code.splitlines():
            line = line.split(" #")[0].strip()
            if line.startswith("turngym "):
                lines.append(
                    pytest.param(
                        where, line, marks=[getattr(pytest.mark, k) for k in marks], id=f"{where}:{line}"
                    )
                )
    return lines


@pytest.mark.parametrize(("where", "line"), turngym_lines())
def test_cli_snippet_runs(where, line, tmp_path):
    args = shlex.split(line)[1:]
    env = {**os.environ, "COLUMNS": "120"}
    out = subprocess.run(
        [sys.executable, "-m", "turngym.cli", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        input="",
        env=env,
    )
    assert out.returncode == 0, f"{where}: `{line}` failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"


def test_cli_reference_is_current(tmp_path):
    target = tmp_path / "cli.md"
    subprocess.run(
        [
            Path(sys.executable).parent / "typer",
            "turngym.cli",
            "utils",
            "docs",
            "--name",
            "turngym",
            "--output",
            str(target),
        ],
        check=True,
        capture_output=True,
    )
    assert (ROOT / "docs" / "cli.md").read_text() == target.read_text(), (
        "docs/cli.md is stale: run `make docs`"
    )


LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_relative_links_resolve():
    """Every relative link or image of README.md and docs/ points at a file or folder that exists."""
    broken = []
    for doc in DOCS:
        for target in LINK.findall(doc.read_text(encoding="utf-8")):
            if target.startswith(("http://", "https://", "mailto:", "#")):
                continue
            if not (doc.parent / target.split("#")[0]).exists():
                broken.append(f"{doc.relative_to(ROOT)} -> {target}")
    assert not broken, broken
