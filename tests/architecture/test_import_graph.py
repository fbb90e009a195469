"""The import graph of ``turngym`` has no cycle.

The graph is read from the source (``ast``), not by importing: an edge ``a -> b`` is an ``import``
in module ``a`` that names module ``b`` (``from pkg import name`` names ``pkg.name`` when that is a
module, else ``pkg``). A package's own ``__init__`` being run first is not an edge. Imports under
``if TYPE_CHECKING:`` and ``if __name__ == "__main__":`` never run at import time and are left out.

* Module level (what runs when a module is imported) must have no cycle at all.
* With the imports inside functions counted too (lazy imports), the only cycles allowed are the
  ones listed in ``KNOWN_LAZY_CYCLES``; a new one fails.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import turngym

PACKAGE = Path(turngym.__file__).parent
SKIP_DIRS = {"templates", "__pycache__"}  # turngym/sdk/templates: scaffold sources, not modules

#: Lazy (function-level) cycles known today, each a sorted tuple of module names. A fix may drop
#: one from this list; nothing may be added without a reason written beside it.
KNOWN_LAZY_CYCLES: set[tuple[str, ...]] = set()


def modules(package: Path) -> dict[str, tuple[Path, bool]]:
    """``{dotted name: (file, is_package)}`` for every module under ``package``."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent).with_suffix("")
        if SKIP_DIRS & set(rel.parts):
            continue
        parts = list(rel.parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts.pop()
        out[".".join(parts)] = (path, is_pkg)
    return out


def _never_runs_on_import(test: ast.expr) -> bool:
    text = ast.unparse(test).replace("'", '"')
    return text in {"TYPE_CHECKING", "typing.TYPE_CHECKING", '__name__ == "__main__"'}


def import_nodes(tree: ast.Module, *, lazy: bool) -> list[ast.Import | ast.ImportFrom]:
    """The import statements of a module: at module level (class bodies included), plus those
    inside functions when ``lazy``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and not lazy:
            return
        if isinstance(node, ast.If) and _never_runs_on_import(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    for stmt in tree.body:
        visit(stmt)
    return found


def import_graph(package: Path, *, lazy: bool = False) -> dict[str, set[str]]:
    mods = modules(package)
    graph: dict[str, set[str]] = {}
    for name, (path, is_pkg) in mods.items():
        deps: set[str] = set()
        for node in import_nodes(ast.parse(path.read_text(encoding="utf-8")), lazy=lazy):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in mods)
                continue
            base = node.module or ""
            if node.level:  # relative: resolved against the importing module's package
                anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in mods:
                    deps.add(full)
                elif base in mods:
                    deps.add(base)
        deps.discard(name)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[tuple[str, ...]] = set()
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(tuple(sorted(component)))
    return found


def _describe(graph: dict[str, set[str]], component: tuple[str, ...]) -> str:
    members = set(component)
    edges = [f"{a} -> {b}" for a in component for b in sorted(graph[a] & members)]
    return "; ".join(edges)


def test_no_import_cycle_at_module_level():
    graph = import_graph(PACKAGE)
    found = cycles(graph)
    assert not found, "import cycles among turngym modules: " + " | ".join(
        _describe(graph, c) for c in sorted(found)
    )


def test_no_new_lazy_import_cycle():
    graph = import_graph(PACKAGE, lazy=True)
    new = cycles(graph) - KNOWN_LAZY_CYCLES
    assert not new, "import cycles through imports inside functions: " + " | ".join(
        _describe(graph, c) for c in sorted(new)
    )


def test_the_graph_sees_real_edges():
    graph = import_graph(PACKAGE)
    assert len(graph) > 100 and "turngym.trainer.torchrun_entry" in graph
    assert "turngym.tools.parsers" in graph["turngym.tools.env"]  # from turngym.tools.parsers import ...
    assert "turngym.trainer.distributed" in graph["turngym.trainer.loop"]
    assert "turngym.trainer.loop" in graph["turngym.trainer.torchrun_entry"]
    # the torchrun entry point no longer sits inside distributed: nothing there leads back to the loop
    assert "turngym.trainer.loop" not in import_graph(PACKAGE, lazy=True)["turngym.trainer.distributed"]


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    pkg = tmp_path / "toy"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "from toy import b\n",
        "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from toy import c\nimport toy.a\n",
        "c.py": "def f():\n    from toy.sub import d\n",
        "sub/__init__.py": "",
        "sub/d.py": "from .. import c\nclass K:\n    from toy.sub import e\n",
        "sub/e.py": 'if __name__ == "__main__":\n    from toy.sub import d\n',
    }
    for rel, text in files.items():
        (pkg / rel).write_text(text)
    return pkg


def test_the_checker_finds_cycles_and_skips_what_never_runs_on_import(toy):
    graph = import_graph(toy)
    assert graph["toy.sub.d"] == {"toy.c", "toy.sub.e"}  # relative import, class body
    assert graph["toy.b"] == {"toy.a"} and graph["toy.sub.e"] == set()
    assert cycles(graph) == {("toy.a", "toy.b")}
    assert cycles(import_graph(toy, lazy=True)) == {("toy.a", "toy.b"), ("toy.c", "toy.sub.d")}


#: The browser families and what each may import besides turngym.envs.browser (issue 20): gui-miniwob
#: is MiniWoB++ through pixels, so it builds on the MiniWoB task layer (task pages, expert) in web.
BROWSER_LEAVES = {"web": set(), "gui": {"web"}, "webarena": set(), "webshop": set()}


def cross_family_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """``(a, b)`` where a browser family (or the browser package itself) imports another family."""
    found = set()
    for a, deps in graph.items():
        pa = a.split(".")
        if len(pa) < 3 or pa[1] != "envs" or (pa[2] not in BROWSER_LEAVES and pa[2] != "browser"):
            continue
        for b in deps:
            pb = b.split(".")
            if len(pb) < 3 or pb[1] != "envs" or pb[2] not in BROWSER_LEAVES or pb[2] == pa[2]:
                continue
            if pa[2] == "browser" or pb[2] not in BROWSER_LEAVES[pa[2]]:
                found.add((a, b))
    return found


def test_browser_families_are_leaves_of_the_browser_package():
    graph = import_graph(PACKAGE, lazy=True)
    assert cross_family_imports(graph) == set()
    # and they really do build on it
    for family in BROWSER_LEAVES:
        assert any(
            b.startswith("turngym.envs.browser")
            for a, deps in graph.items()
            for b in deps
            if a.startswith(f"turngym.envs.{family}.")
        ), family


def test_the_leaf_check_sees_a_cross_family_import():
    graph = {
        "turngym.envs.webshop.env": {"turngym.envs.webarena.sites", "turngym.envs.browser.sites.env"},
        "turngym.envs.gui.env": {"turngym.envs.web.base"},
        "turngym.envs.browser.env": {"turngym.envs.web.page"},
    }
    assert cross_family_imports(graph) == {
        ("turngym.envs.webshop.env", "turngym.envs.webarena.sites"),
        ("turngym.envs.browser.env", "turngym.envs.web.page"),
    }


def test_only_the_cli_imports_the_trainer_adapters():
    """``turngym.interop`` (TRL/verifiers adapters) pulls in third-party trainers: nothing but the CLI and
    the package itself may import it."""
    graph = import_graph(PACKAGE, lazy=True)
    found = {
        (a, b)
        for a, deps in graph.items()
        for b in deps
        if b.startswith("turngym.interop") and not a.startswith("turngym.interop") and a != "turngym.cli"
    }
    assert found == set(), "modules importing turngym.interop"
