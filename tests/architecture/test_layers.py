"""The layer table of docs/architecture.md holds for every import, and the size budget holds.

* Layers: each top-level package (or module) of ``turngym`` has a layer in the table of
  ``docs/architecture.md``; an import from a lower layer to a higher one fails. Every import counts:
  module level, inside functions and under ``TYPE_CHECKING``. A package's ``commands`` module is the
  command line's wiring of that package and sits in the ``cli`` layer.
* Sizes: no module over 600 lines, no class over 400, no module docstring over 30 lines. The
  offenders of today are listed with their sizes: they may shrink or leave the list, never grow,
  and nothing may join it.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

import turngym
from tests.architecture.test_import_graph import PACKAGE, SKIP_DIRS, cycles, import_graph

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"

#: imports that go up a layer today, each with the issue step that removes it (none left)
KNOWN_UPWARD: set[tuple[str, str]] = set()

#: import cycles counting type-only and lazy imports, known today; none may be added
KNOWN_CYCLES: set[tuple[str, ...]] = set()

MAX_MODULE_LINES, MAX_CLASS_LINES, MAX_DOC_LINES = 600, 400, 30
#: today's offenders: (path relative to the package's parent, kind, name) -> size
KNOWN_OVERSIZE: dict[tuple[str, str, str], int] = {}


def layer_table() -> dict[str, int]:
    """``{top-level name: layer}`` from the table after the ``<!-- layers`` marker."""
    text = DOC.read_text(encoding="utf-8")
    table = text[text.index("<!-- layers") :].split("\n\n")[0]
    rows = re.findall(r"^\| (\d+) \| `([a-z_]+)` \|", table, flags=re.M)
    return {name: int(layer) for layer, name in rows}


def _top(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 2 and parts[-1] == "commands":
        return "cli"  # a package's command-line wiring
    return parts[1] if len(parts) > 1 else ""


@functools.cache
def full_graph() -> dict[str, set[str]]:
    """The import graph with lazy and ``TYPE_CHECKING`` imports (``__main__`` blocks left out)."""
    import tests.architecture.test_import_graph as g

    keep = g._never_runs_on_import
    g._never_runs_on_import = lambda test: ast.unparse(test).replace("'", '"') == '__name__ == "__main__"'
    try:
        return import_graph(PACKAGE, lazy=True)
    finally:
        g._never_runs_on_import = keep


def test_every_package_has_a_layer():
    layers = layer_table()
    tops = {p.name if p.is_dir() else p.stem for p in PACKAGE.iterdir() if p.suffix == ".py" or p.is_dir()}
    tops = {n for n in tops if not n.startswith("__")}
    missing = sorted(tops - set(layers))
    assert not missing, f"docs/architecture.md's layer table lacks: {missing}"
    assert layers["core"] == 0 and layers["cli"] == max(layers.values())


def upward_imports(graph: dict[str, set[str]], layers: dict[str, int]) -> set[tuple[str, str]]:
    """``(a, b)`` where module ``a`` imports module ``b`` of a higher layer."""
    upward = set()
    for a, deps in graph.items():
        for b in deps:
            ta, tb = _top(a), _top(b)
            if ta and tb and ta != tb and layers.get(tb, 99) > layers.get(ta, 99):
                upward.add((a, b))
    return upward


def test_the_layer_check_sees_an_upward_import():
    graph = {"turngym.sandboxes.docker": {"turngym.envs.swe.packages", "turngym.core.env"}}
    graph["turngym.sandboxes.commands"] = {"turngym.envs.swe.packages"}  # the CLI layer may
    assert upward_imports(graph, layer_table()) == {("turngym.sandboxes.docker", "turngym.envs.swe.packages")}


def test_no_import_goes_up_a_layer():
    upward = upward_imports(full_graph(), layer_table())
    new = upward - KNOWN_UPWARD
    assert not new, "imports up a layer (see docs/architecture.md): " + ", ".join(
        f"{a} -> {b}" for a, b in sorted(new)
    )
    fixed = KNOWN_UPWARD - upward
    assert not fixed, f"no longer imported, drop from KNOWN_UPWARD: {sorted(fixed)}"


def test_no_new_cycle_counting_type_only_imports():
    found = cycles(full_graph())
    assert not found - KNOWN_CYCLES, f"new import cycles: {sorted(found - KNOWN_CYCLES)}"
    assert not KNOWN_CYCLES - found, f"gone, drop from KNOWN_CYCLES: {sorted(KNOWN_CYCLES - found)}"


def oversize() -> dict[tuple[str, str, str], int]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if SKIP_DIRS & set(path.parts):
            continue
        rel = path.relative_to(PACKAGE.parent).as_posix()
        src = path.read_text(encoding="utf-8")
        tree = ast.parse(src)
        lines = src.count("\n")
        if lines > MAX_MODULE_LINES:
            out[(rel, "module", "")] = lines
        doc = ast.get_docstring(tree)
        if doc and doc.count("\n") + 1 > MAX_DOC_LINES:
            out[(rel, "doc", "")] = doc.count("\n") + 1
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                size = node.end_lineno - node.lineno + 1
                if size > MAX_CLASS_LINES:
                    out[(rel, "class", node.name)] = size
    return out


def test_size_budget_only_shrinks():
    found = oversize()
    new = {k: v for k, v in found.items() if k not in KNOWN_OVERSIZE}
    assert not new, (
        f"over the size budget (module {MAX_MODULE_LINES}, class {MAX_CLASS_LINES}, docstring {MAX_DOC_LINES} lines): {new}"
    )
    grew = {
        k: (KNOWN_OVERSIZE[k], v) for k, v in found.items() if k in KNOWN_OVERSIZE and v > KNOWN_OVERSIZE[k]
    }
    assert not grew, f"known offenders that grew (was, now): {grew}"
    fixed = sorted(set(KNOWN_OVERSIZE) - set(found))
    assert not fixed, f"within the budget now, drop from KNOWN_OVERSIZE: {fixed}"


@pytest.mark.parametrize("module", ["turngym.trainer.loop", "turngym.rollout.tree"])
def test_split_rooms_stay_small(module):
    """The trainer is a short loop over its roles; the tree runner uses only the public episode runner."""
    path = PACKAGE.parent / (module.replace(".", "/") + ".py")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    if module.endswith("loop"):
        trainer = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Trainer")
        methods = [n for n in trainer.body if isinstance(n, ast.FunctionDef)]
        assert len(methods) <= 8 and path.read_text().count("\n") < 250
    else:
        private = [
            n.attr
            for n in ast.walk(tree)
            if isinstance(n, ast.Attribute)
            and n.attr.startswith("_")
            and not n.attr.startswith("__")
            and isinstance(n.value, ast.Name)
            and n.value.id in {"eng", "engine"}
        ]
        assert not private, f"private engine calls in tree.py: {private}"
        assert "turngym.rollout.engine" not in full_graph()[module]


def test_turngym_is_the_package_checked():
    assert Path(turngym.__file__).parent == PACKAGE


def test_limit_turns_is_written_once():
    """Every env kind inherits ``limit_turns`` from ``core.env.TurnLimited``; the only other definitions
    are the protocol's stub and the wrappers' forwarding to the env they wrap."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if SKIP_DIRS & set(path.parts):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name == "limit_turns":
                        found.append(f"{path.relative_to(PACKAGE.parent).as_posix()}:{node.name}")
    assert sorted(found) == [
        "turngym/core/env.py:EnvProtocol",
        "turngym/core/env.py:TurnLimited",
        "turngym/core/wrappers.py:AsyncWrapper",
    ]
