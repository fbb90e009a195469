"""Bug injection by AST mutation, applied as minimal text edits so diffs stay small and readable.

Operators (SWE-smith / mutation-testing style): ``operator_swap`` (comparison, arithmetic and
boolean operators), ``off_by_one`` (integer constants), ``removed_branch`` (an ``if`` without
``else``), ``wrong_default`` (a parameter default), ``swapped_args`` (the first two positional
arguments of a call) and ``wrong_return`` (a negated / flipped / wrong-variable return value).

Each :class:`Mutation` knows the source it came from and can render the mutated source, the gold
patch (mutated -> original, ``git apply``-able) and a unique ``str_replace`` edit that reverts it.
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Iterator
from dataclasses import dataclass

OPERATORS = ("operator_swap", "off_by_one", "removed_branch", "wrong_default", "swapped_args", "wrong_return")

_CMP_SWAP: dict[type, type] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}
_BIN_SWAP: dict[type, type] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.FloorDiv,
    ast.FloorDiv: ast.Mult,
    ast.Mod: ast.FloorDiv,
    ast.BitAnd: ast.BitOr,
    ast.BitOr: ast.BitAnd,
}


@dataclass(frozen=True)
class Mutation:
    """One text edit ``source[start:end] -> replacement`` inside function ``function`` of ``path``."""

    path: str
    function: str
    kind: str
    line: int
    start: int
    end: int
    replacement: str
    description: str

    def apply(self, source: str) -> str:
        return source[: self.start] + self.replacement + source[self.end :]

    def revert_edit(self, source: str) -> dict[str, str]:
        """A ``str_replace`` edit (old = mutated text, new = original) unique in both versions."""
        mutated = self.apply(source)
        lines_before = source[: self.start].count("\n")
        o_lines, m_lines = source.splitlines(keepends=True), mutated.splitlines(keepends=True)
        o_end = source[: self.end].count("\n") + 1
        m_end = lines_before + self.replacement.count("\n") + 1
        for ctx in range(0, 8):
            lo = max(lines_before - ctx, 0)
            old = "".join(m_lines[lo : m_end + ctx])
            new = "".join(o_lines[lo : o_end + ctx])
            if old and mutated.count(old) == 1 and source.count(new) == 1:
                return {"path": self.path, "old_str": old, "new_str": new}
        raise ValueError(f"no unique revert edit for {self}")


def unified_patch(path: str, before: str, after: str) -> str:
    """A git-style unified diff that turns ``before`` into ``after`` (for ``git apply``)."""
    lines = list(
        difflib.unified_diff(
            before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{path}", f"b/{path}", n=3
        )
    )
    out = [f"diff --git a/{path} b/{path}\n"]
    for line in lines:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


class _Offsets:
    """Converts AST (line, UTF-8 byte column) positions to string offsets."""

    def __init__(self, source: str):
        self.source = source
        self.lines = source.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def at(self, line: int, col: int) -> int:
        text = self.lines[line - 1].encode()[:col].decode(errors="replace")
        return self.starts[line - 1] + len(text)

    def span(self, node: ast.AST) -> tuple[int, int]:
        return (
            self.at(node.lineno, node.col_offset),  # type: ignore[attr-defined]
            self.at(node.end_lineno, node.end_col_offset),  # type: ignore[attr-defined]
        )


def functions(tree: ast.AST) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method with its qualified name."""

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                yield name, child
                yield from walk(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


def first_line(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The line Python reports as the function's ``co_firstlineno`` (its first decorator, if any)."""
    return min([fn.lineno] + [d.lineno for d in fn.decorator_list])


def _own_nodes(fn: ast.AST) -> Iterator[ast.AST]:
    """Nodes of a function's body, not descending into nested functions, classes or lambdas."""
    stack = list(getattr(fn, "body", []))
    while stack:
        node = stack.pop(0)
        yield node
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
                stack.append(child)


def _is_docstring(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    parent = parents.get(node)
    return isinstance(parent, ast.Expr) and isinstance(node, ast.Constant) and isinstance(node.value, str)


def mutations_of(path: str, source: str, only_lines: set[int] | None = None) -> list[Mutation]:
    """All candidate mutations of ``source`` (a file at ``path``), optionally only in functions whose
    first line is in ``only_lines`` (the functions the tests execute)."""
    tree = ast.parse(source)
    off = _Offsets(source)
    out: list[Mutation] = []
    for name, fn in functions(tree):
        if only_lines is not None and first_line(fn) not in only_lines:
            continue
        out.extend(_mutations_in(path, name, fn, off))
    return out


def _mutations_in(
    path: str, name: str, fn: ast.FunctionDef | ast.AsyncFunctionDef, off: _Offsets
) -> list[Mutation]:
    out: list[Mutation] = []

    def add(kind: str, node: ast.AST, replacement: str, description: str) -> None:
        start, end = off.span(node)
        if off.source[start:end] != replacement:
            out.append(Mutation(path, name, kind, node.lineno, start, end, replacement, description))  # type: ignore[attr-defined]

    parents = {child: parent for parent in ast.walk(fn) for child in ast.iter_child_nodes(parent)}
    params = [
        a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs if a.arg not in ("self", "cls")
    ]

    # wrong default: bool flips and integers +1 in the signature
    for default in list(fn.args.defaults) + [d for d in fn.args.kw_defaults if d is not None]:
        if isinstance(default, ast.Constant):
            if isinstance(default.value, bool):
                add("wrong_default", default, repr(not default.value), "flipped a boolean default")
            elif isinstance(default.value, int):
                add("wrong_default", default, repr(default.value + 1), "changed an integer default")

    for node in _own_nodes(fn):
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMP_SWAP:
            new = ast.Compare(
                left=node.left, ops=[_CMP_SWAP[type(node.ops[0])]()], comparators=node.comparators
            )
            add("operator_swap", node, ast.unparse(new), "swapped a comparison operator")
        elif isinstance(node, ast.BinOp) and type(node.op) in _BIN_SWAP:
            if isinstance(node.left, ast.Constant) and isinstance(node.left.value, str):
                continue  # string formatting with %
            new = ast.BinOp(left=node.left, op=_BIN_SWAP[type(node.op)](), right=node.right)
            add("operator_swap", node, ast.unparse(new), "swapped an arithmetic operator")
        elif isinstance(node, ast.BoolOp) and len(node.values) == 2:
            new_op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
            add(
                "operator_swap",
                node,
                ast.unparse(ast.BoolOp(op=new_op, values=node.values)),
                "swapped and/or",
            )
        elif (
            isinstance(node, ast.Constant)
            and type(node.value) is int
            and not _is_docstring(node, parents)
            and isinstance(parents.get(node), ast.Compare | ast.BinOp | ast.Subscript | ast.Slice | ast.Call)
        ):
            add("off_by_one", node, repr(node.value + 1), "off-by-one in an integer constant")
        elif isinstance(node, ast.If) and not node.orelse and not _is_elif(node, parents):
            block = _block_of(node, parents)
            start = off.starts[node.lineno - 1]
            end = off.starts[node.end_lineno] if node.end_lineno < len(off.starts) else len(off.source)  # type: ignore[operator]
            indent = off.lines[node.lineno - 1][: node.col_offset]
            replacement = f"{indent}pass\n" if block is not None and len(block) == 1 else ""
            out.append(
                Mutation(
                    path, name, "removed_branch", node.lineno, start, end, replacement, "removed an if-branch"
                )
            )
        elif (
            isinstance(node, ast.Call)
            and len(node.args) >= 2
            and not any(isinstance(a, ast.Starred) for a in node.args[:2])
        ):
            a, b = node.args[0], node.args[1]
            sa, ea = off.span(a)
            sb, eb = off.span(b)
            ta, tb = off.source[sa:ea], off.source[sb:eb]
            if ta != tb and "\n" not in off.source[sa:eb]:
                text = tb + off.source[ea:sb] + ta
                out.append(
                    Mutation(path, name, "swapped_args", a.lineno, sa, eb, text, "swapped two call arguments")
                )
        elif isinstance(node, ast.Return) and node.value is not None:
            v = node.value
            if isinstance(v, ast.Constant) and isinstance(v.value, bool):
                add("wrong_return", v, repr(not v.value), "flipped a returned boolean")
            elif isinstance(v, ast.Compare | ast.BoolOp):
                add("wrong_return", v, f"not ({ast.unparse(v)})", "negated a returned condition")
            elif isinstance(v, ast.Name):
                others = [p for p in params if p != v.id]
                if others:
                    add("wrong_return", v, others[0], "returned the wrong variable")
    return out


def _is_elif(node: ast.If, parents: dict[ast.AST, ast.AST]) -> bool:
    parent = parents.get(node)
    return isinstance(parent, ast.If) and parent.orelse == [node]


def _block_of(node: ast.stmt, parents: dict[ast.AST, ast.AST]) -> list[ast.stmt] | None:
    parent = parents.get(node)
    for field in ("body", "orelse", "finalbody", "handlers"):
        block = getattr(parent, field, None)
        if isinstance(block, list) and node in block:
            return block
    return None


def still_parses(source: str) -> bool:
    try:
        ast.parse(source)
    except SyntaxError:
        return False
    return True
