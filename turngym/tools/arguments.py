"""What a tool call may carry: JSON values in valid Unicode, and the error raised when it does not.

Tool calls reach an env as text (parsed with ``json``) or as structured ``Message.tool_calls`` built
from an API's JSON. Either way, a call can hold things no tool should see and no serialiser can write:
a lone UTF-16 surrogate (``"\\ud800"`` is legal JSON escape syntax but not Unicode text), ``NaN`` or
``Infinity`` (Python's ``json`` reads them; JSON has no such numbers), a non-string object key, a
Python object that is no JSON value at all (bytes, sets, ...) or nesting deep enough to exhaust a
recursive encoder. :func:`json_problem` finds the first such thing and says where it is, so that the
parsers and the ``ToolBox`` turn it into an invalid turn with an error observation before anything
tries to encode it (a tokenizer, ``model_dump_json``, an MCP transport).

Integers are checked for size too: CPython refuses to print an int of more than 4,300 digits, so such a
number would raise far from where it was read.
"""

from __future__ import annotations

import math
from typing import Any

#: deepest nesting of arrays/objects accepted in a call (tool schemas need a handful of levels)
MAX_DEPTH = 64
#: longest integer accepted, in decimal digits (below CPython's ``sys.get_int_max_str_digits()``)
MAX_INT_DIGITS = 1_000
_INT_LIMIT = 10**MAX_INT_DIGITS


class BadArguments(ValueError):
    """A call's arguments are not acceptable: not JSON values, invalid Unicode, or (raised by a
    ``ToolDef.validate`` that does not use pydantic, such as an MCP tool's JSON-Schema validator) not
    what the tool's schema asks for. The call becomes a ``bad_arguments`` error observation."""


def invalid_unicode(text: str) -> int | None:
    """The index of the first lone surrogate in ``text``, or None when ``text`` is valid Unicode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def _where(path: list[str | int]) -> str:
    out = ""
    for p in path:
        if isinstance(p, str) and len(p) > 40:  # a key may be megabytes long: the message stays short
            p = p[:37] + "..."
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out or "(arguments)"


def _string_problem(text: str) -> str | None:
    at = invalid_unicode(text)
    if at is None:
        return None
    return f"holds a lone surrogate {ascii(text[at])} at index {at}, which is not valid Unicode text"


def json_problem(value: Any, root: str = "") -> str | None:
    """What makes ``value`` something other than a JSON value in valid Unicode, as a sentence that
    names its place (``topic``, ``plan[2].city``), or None when it is fine. Never raises."""
    stack: list[tuple[Any, list[str | int]]] = [(value, [root] if root else [])]
    while stack:
        node, path = stack.pop()
        if len(path) > MAX_DEPTH + 1:
            return f"{_where(path)}: nested more than {MAX_DEPTH} levels deep"
        if node is None or isinstance(node, bool):
            continue
        if isinstance(node, str):
            problem = _string_problem(node)
            if problem:
                return f"{_where(path)} {problem}"
        elif isinstance(node, int):
            if not -_INT_LIMIT < node < _INT_LIMIT:
                return f"{_where(path)}: an integer of more than {MAX_INT_DIGITS} digits"
        elif isinstance(node, float):
            if not math.isfinite(node):
                return f"{_where(path)}: {node!r} is not a JSON number"
        elif isinstance(node, dict):
            for key, child in node.items():
                if not isinstance(key, str):
                    return f"{_where(path)}: object key {key!r} is not a string"
                problem = _string_problem(key)
                if problem:
                    return f"{_where(path)}: an object key {problem}"
                stack.append((child, [*path, key]))
        elif isinstance(node, (list, tuple)):
            stack.extend((child, [*path, i]) for i, child in enumerate(node))
        else:
            return f"{_where(path)}: a {type(node).__name__} is not a JSON value"
    return None


def call_problem(name: Any, arguments: Any) -> str | None:
    """What is wrong with a call's ``name`` and ``arguments`` at the level of text and JSON (not the
    tool's schema): a sentence for the model, or None."""
    if not isinstance(name, str):
        return f"the tool name must be a string, got {type(name).__name__}"
    problem = _string_problem(name)
    if problem:
        return f"the tool name {problem}"
    if not isinstance(arguments, dict):
        return f"arguments must be an object, got {type(arguments).__name__}"
    problem = json_problem(arguments)
    return f"argument {problem}" if problem and not problem.startswith("(arguments)") else problem
