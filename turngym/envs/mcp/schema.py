"""MCP tool input schemas -> turngym ``ToolSpec``, and argument validation against them.

turngym gives a model its tools as OpenAI function-calling schemas (``ToolSpec.parameters``), which
chat templates render and OpenAI-style APIs accept. That is JSON Schema with an object at the root,
restricted to what function calling carries: ``type`` (one or a list), ``properties``, ``required``,
``items``, ``enum``, ``const``, ``anyOf``/``oneOf``/``allOf``, ``additionalProperties``, local ``$ref``
into ``$defs``/``definitions``, the string/number/array bounds, ``format``, ``default``, ``description``
and ``title``. A schema turngym cannot express raises :class:`UnsupportedSchema`, whose message names the
tool and the JSON path of the offending part:

* a root that is not an object (``type`` other than ``"object"``, or no ``properties``/``type`` at all
  together with other keywords that make it something else);
* a keyword in :data:`UNSUPPORTED_KEYWORDS` (conditionals, negation, pattern/dependent properties,
  tuple items, dynamic references): function calling has no way to tell the model about them;
* a ``$ref`` that is not local (``#/...``) or does not resolve;
* a schema that is not valid JSON Schema (draft 2020-12), e.g. ``{"type": "strnig"}``.

Arguments are validated with ``jsonschema`` (draft 2020-12) before a call reaches its server, so a
wrong type is a ``bad_arguments`` observation naming the argument, the same as for a Python tool: first
as JSON in valid Unicode (``turngym.tools.arguments``), then against the schema, where an ``integer``
is an integer literal (``7``, not ``7.0``, ``true`` or ``"7"``), as for a Python tool's ``int``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

import jsonschema
import jsonschema.exceptions
from jsonschema.validators import Draft202012Validator, extend

from turngym.core.types import ToolSpec
from turngym.tools.arguments import BadArguments, json_problem

#: JSON Schema keywords function calling cannot carry; a schema using one is refused.
UNSUPPORTED_KEYWORDS = frozenset(
    {
        "not",
        "if",
        "then",
        "else",
        "dependentSchemas",
        "dependentRequired",
        "dependencies",
        "patternProperties",
        "prefixItems",
        "contains",
        "minContains",
        "maxContains",
        "unevaluatedProperties",
        "unevaluatedItems",
        "$dynamicRef",
        "$dynamicAnchor",
        "$recursiveRef",
        "$recursiveAnchor",
    }
)
#: keywords whose value is a schema / a map of schemas / a list of schemas (walked for the checks)
_SUB_SCHEMA = ("items", "additionalProperties", "propertyNames")
_SUB_MAP = ("properties", "$defs", "definitions")
_SUB_LIST = ("anyOf", "oneOf", "allOf")
_OPENAI_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class UnsupportedSchema(ValueError):
    """An MCP tool's input schema that turngym cannot express; the message names the tool and the part."""

    def __init__(self, tool: str, path: str, reason: str):
        super().__init__(f"tool {tool!r}: input schema at {path}: {reason}")
        self.tool, self.path, self.reason = tool, path, reason


def _pointer(parts: list[str]) -> str:
    return "#" + "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


def _walk(tool: str, node: Any, parts: list[str], root: Mapping[str, Any]) -> None:
    if isinstance(node, bool):  # true/false schemas are valid JSON Schema and expressible
        return
    if not isinstance(node, Mapping):
        raise UnsupportedSchema(
            tool, _pointer(parts), f"a schema must be an object, got {type(node).__name__}"
        )
    for key in node:
        if key in UNSUPPORTED_KEYWORDS:
            raise UnsupportedSchema(
                tool,
                _pointer([*parts, key]),
                f"the keyword {key!r} cannot be expressed in a function-call schema",
            )
    ref = node.get("$ref")
    if ref is not None:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise UnsupportedSchema(
                tool, _pointer([*parts, "$ref"]), f"only local $ref ('#/...') is supported, got {ref!r}"
            )
        target: Any = root
        for piece in ref[1:].split("/")[1:] if ref != "#" else []:
            piece = piece.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, Mapping) or piece not in target:
                raise UnsupportedSchema(tool, _pointer([*parts, "$ref"]), f"$ref {ref!r} does not resolve")
            target = target[piece]
    for key in _SUB_SCHEMA:
        if key in node and not isinstance(node[key], bool):
            _walk(tool, node[key], [*parts, key], root)
    for key in _SUB_MAP:
        sub = node.get(key)
        if sub is None:
            continue
        if not isinstance(sub, Mapping):
            raise UnsupportedSchema(tool, _pointer([*parts, key]), f"{key!r} must map names to schemas")
        for name, child in sub.items():
            _walk(tool, child, [*parts, key, str(name)], root)
    for key in _SUB_LIST:
        sub = node.get(key)
        if sub is None:
            continue
        if not isinstance(sub, list) or not sub:
            raise UnsupportedSchema(
                tool, _pointer([*parts, key]), f"{key!r} must be a non-empty list of schemas"
            )
        for i, child in enumerate(sub):
            _walk(tool, child, [*parts, key, str(i)], root)


@functools.cache
def _meta_validator() -> Draft202012Validator:
    """A validator of schemas against the draft 2020-12 meta-schema (built once: it is not cheap)."""
    return Draft202012Validator(Draft202012Validator.META_SCHEMA)


def check_schema(tool: str, schema: Any) -> dict[str, Any]:
    """The input schema as a function-call ``parameters`` object, or :class:`UnsupportedSchema`."""
    if schema is None:
        schema = {"type": "object", "properties": {}}
    if not isinstance(schema, Mapping):
        raise UnsupportedSchema(tool, "#", f"the input schema must be an object, got {type(schema).__name__}")
    schema = dict(schema)
    root_type = schema.get("type", "object")
    if root_type != "object":
        raise UnsupportedSchema(
            tool, "#/type", f"the root must be an object schema (type 'object'), got type {root_type!r}"
        )
    _walk(tool, schema, [], schema)
    error = jsonschema.exceptions.best_match(_meta_validator().iter_errors(schema))
    if error is not None:
        where = _pointer([str(p) for p in error.absolute_path])
        raise UnsupportedSchema(tool, where, f"not a valid JSON Schema: {error.message}")
    schema.pop("$schema", None)
    schema["type"] = "object"
    schema.setdefault("properties", {})
    return schema


def to_tool_spec(
    name: str, description: str | None, input_schema: Any, *, tool: str | None = None
) -> ToolSpec:
    """A ``ToolSpec`` named ``name`` for an MCP tool (``tool``: its name on the server, for messages)."""
    if not _OPENAI_NAME.match(name):
        raise UnsupportedSchema(tool or name, "name", f"tool name {name!r} must match [A-Za-z0-9_-]{{1,64}}")
    return ToolSpec(
        name=name, description=description or "", parameters=check_schema(tool or name, input_schema)
    )


def sanitize_name(name: str) -> str:
    """``name`` with characters function calling does not allow replaced by ``_``, at most 64 long."""
    clean = re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64]
    return clean or "tool"


def _integer_literal(checker: Any, instance: Any) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


#: draft 2020-12, except that ``integer`` means an integer literal: JSON Schema calls ``7.0`` an integer,
#: but a model that writes ``7.0`` for an int argument gets the same answer from every turngym tool
StrictValidator = extend(
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _integer_literal),
)


class ArgumentValidator:
    """Validates a call's arguments against a (checked) input schema; raises :class:`BadArguments`."""

    def __init__(self, schema: dict[str, Any]):
        self._validator = StrictValidator(schema)

    def __call__(self, arguments: dict[str, Any]) -> dict[str, Any]:
        problem = json_problem(arguments)
        if problem:
            raise BadArguments(problem)
        errors = sorted(self._validator.iter_errors(arguments), key=lambda e: list(map(str, e.absolute_path)))
        if errors:
            parts = []
            for e in errors[:5]:
                where = ".".join(str(p) for p in e.absolute_path)
                msg = e.message if len(e.message) <= 200 else e.message[:197] + "..."
                parts.append(f"argument {where!r}: {msg}" if where else msg)
            raise BadArguments("; ".join(parts))
        return arguments
