"""``@tool``: a typed Python function (or method) becomes a tool with a JSON schema.

The schema comes from the signature (types through pydantic) and the docstring
(summary and per-argument descriptions through ``docstring_parser``).
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable
from typing import Any, get_type_hints

import docstring_parser
import pydantic
from pydantic import ConfigDict

from turngym.core.types import ToolSpec
from turngym.tools.arguments import BadArguments

_TOOL_ATTR = "__turngym_tool__"


class ToolDef:
    """A tool's definition: the function, its spec and an argument validator."""

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str | None = None,
        description: str | None = None,
        terminal: bool = False,
        timeout: float | None = None,
    ):
        doc = docstring_parser.parse(inspect.getdoc(fn) or "")
        summary = " ".join(p for p in (doc.short_description, doc.long_description) if p)
        self._define(
            fn, name or fn.__name__, description if description is not None else summary, terminal, timeout
        )
        arg_docs = {p.arg_name: (p.description or "") for p in doc.params}
        self.model = _arguments_model(fn, self.name, arg_docs)
        self.spec = ToolSpec(
            name=self.name,
            description=self.description,
            parameters=_clean_schema(self.model.model_json_schema()),
            terminal=terminal,
        )

    def _define(
        self, fn: Callable[..., Any], name: str, description: str, terminal: bool, timeout: float | None
    ) -> None:
        """What every definition holds besides its spec and validator (a subclass that brings its own
        spec, like an MCP server's tool, calls this instead of ``__init__``)."""
        self.fn = fn
        self.name = name
        self.terminal = terminal
        self.timeout = timeout
        self.is_async = inspect.iscoroutinefunction(fn)
        self.description = description

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Validated keyword arguments; raises ``pydantic.ValidationError`` (or ``BadArguments`` for
        arguments that are not JSON values).

        Arguments are JSON, so they are validated as JSON in pydantic's strict mode: ``true``, ``"7"``
        and ``7.0`` are not an ``int``, ``1`` is not a ``bool``, ``NaN`` is no number; strings still
        become what JSON spells as strings (dates, enums, literals), and an int is a fine ``float``.
        """
        try:
            text = json.dumps(arguments, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError, RecursionError) as e:
            raise BadArguments(f"the arguments are not JSON values ({e})") from e
        model = self.model.model_validate_json(text, strict=True)
        return {k: getattr(model, k) for k in type(model).model_fields}

    def bind(self, owner: Any) -> BoundTool:
        return BoundTool(self, owner)

    def __repr__(self) -> str:
        return f"ToolDef({self.name!r})"


class BoundTool:
    """A ``ToolDef`` together with the object its method runs on (or none, for a function)."""

    def __init__(self, definition: ToolDef, owner: Any = None):
        self.definition = definition
        self.owner = owner

    @property
    def name(self) -> str:
        return self.definition.name

    @property
    def spec(self) -> ToolSpec:
        return self.definition.spec

    def __call__(self, **kwargs: Any) -> Any:
        fn = self.definition.fn
        return fn(self.owner, **kwargs) if self.owner is not None else fn(**kwargs)


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    terminal: bool = False,
    timeout: float | None = None,
) -> Any:
    """Mark a function or method as a tool.

    Use bare (``@tool``) or with options (``@tool(terminal=True, timeout=5)``). The
    function keeps working as a normal Python function; ``fn.__turngym_tool__`` holds
    the :class:`ToolDef`.
    """

    def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
        definition = ToolDef(f, name=name, description=description, terminal=terminal, timeout=timeout)

        if definition.is_async:

            @functools.wraps(f)
            async def awrapper(*args: Any, **kwargs: Any) -> Any:
                return await f(*args, **kwargs)

            wrapper: Any = awrapper
        else:

            @functools.wraps(f)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                return f(*args, **kwargs)

        setattr(wrapper, _TOOL_ATTR, definition)
        return wrapper

    return wrap(fn) if fn is not None else wrap


def tool_def(obj: Any) -> ToolDef | None:
    return getattr(obj, _TOOL_ATTR, None)


def tools_of(owner: Any) -> list[BoundTool]:
    """All ``@tool`` methods of an object (its class's, in definition order, subclasses overriding)."""
    seen: dict[str, BoundTool] = {}
    for klass in reversed(type(owner).__mro__):
        for attr, value in vars(klass).items():
            definition = tool_def(value)
            if definition is not None:
                seen.pop(attr, None)
                seen[attr] = definition.bind(owner)
            elif attr in seen:  # overridden by a non-tool: no longer a tool
                del seen[attr]
    return list(seen.values())


def _arguments_model(fn: Callable[..., Any], name: str, arg_docs: dict[str, str]) -> type[pydantic.BaseModel]:
    sig = inspect.signature(fn)
    try:
        hints = get_type_hints(fn)
    except Exception:  # unresolved forward refs: fall back to raw annotations
        hints = {}
    fields: dict[str, Any] = {}
    params = list(sig.parameters.values())
    if params and params[0].name in ("self", "cls"):
        params = params[1:]
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"tool {name!r}: *args/**kwargs are not allowed in a tool signature")
        ann = hints.get(p.name, p.annotation)
        if ann is inspect.Parameter.empty:
            raise TypeError(f"tool {name!r}: argument {p.name!r} needs a type annotation")
        default = ... if p.default is inspect.Parameter.empty else p.default
        fields[p.name] = (ann, pydantic.Field(default, description=arg_docs.get(p.name) or None))
    model_name = "".join(part.capitalize() for part in name.replace("-", "_").split("_")) + "Args"
    return pydantic.create_model(model_name, __config__=ConfigDict(extra="forbid"), **fields)


def _clean_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Drop pydantic's ``title`` noise; keep everything else (``$defs`` included)."""

    def clean(node: Any) -> Any:
        if isinstance(node, dict):
            return {
                k: clean(v)
                for k, v in node.items()
                if not (
                    k == "title" and isinstance(v, str) and "type" in node or k == "title" and node is schema
                )
            }
        if isinstance(node, list):
            return [clean(v) for v in node]
        return node

    out = clean(schema)
    out.setdefault("properties", {})
    out["type"] = "object"
    return out
