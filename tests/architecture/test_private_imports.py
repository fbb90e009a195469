"""No module of ``turngym.agents`` or ``turngym.rollout`` imports a private name (``_x``) from another
module: what one module shares with another is public, so a split never leans on another file's
internals (docs/architecture.md). Every import counts, lazy and ``TYPE_CHECKING`` ones included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.architecture.test_import_graph import PACKAGE

CHECKED = ("agents", "rollout")


def private_imports(path: Path, module: str) -> list[str]:
    """``"source._name"`` for each private name ``module`` (at ``path``) imports from another module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:  # relative: resolved against the importing module's package
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        if source == module or not source.startswith("turngym"):
            continue
        found += [
            f"{source}.{a.name}" for a in node.names if a.name.startswith("_") and not a.name.startswith("__")
        ]
    return found


def test_the_check_sees_a_private_import(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        "from turngym.agents.hf.request import Request, _x\n"
        "def f():\n    from turngym.agents.chat import _y\n"
        "from turngym.agents.m import _own\n"
    )
    assert private_imports(path, "turngym.agents.m") == [
        "turngym.agents.hf.request._x",
        "turngym.agents.chat._y",
    ]


@pytest.mark.parametrize("package", CHECKED)
def test_no_cross_file_private_imports(package):
    bad = {}
    for path in sorted((PACKAGE / package).rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts[:-1]) if rel.name == "__init__" else list(rel.parts)
        found = private_imports(path, ".".join(parts))
        if found:
            bad[rel.as_posix()] = found
    assert not bad, f"private names imported from other modules (make them public or move them): {bad}"
