"""``ToolBox``: dispatch tool calls, turning every failure into an error result."""

from __future__ import annotations

import asyncio
import difflib
import inspect
import json
import time
from collections.abc import Callable, Iterable
from typing import Any

import pydantic

from turngym.core.types import ToolCall, ToolResult, ToolSpec
from turngym.tools.arguments import BadArguments, invalid_unicode, json_problem
from turngym.tools.decorator import BoundTool, ToolDef, tool_def, tools_of

__all__ = ["BadArguments", "ToolBox", "ToolError", "ToolOutput", "truncate"]


class ToolOutput(pydantic.BaseModel):
    """A richer tool return value: text plus optional PNG images."""

    model_config = pydantic.ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")

    text: str = ""
    images: list[bytes] = pydantic.Field(default_factory=list)


class ToolError(Exception):
    """Raise inside a tool for an expected failure; the message goes to the model as is."""


def truncate(text: str, limit: int) -> tuple[str, bool]:
    """Keep the head and tail of ``text`` within ``limit`` characters, with a marker between."""
    if limit <= 0 or len(text) <= limit:
        return text, False
    marker = f"\n[... {len(text) - limit} characters truncated ...]\n"
    keep = max(limit - len(marker), 0)
    head = keep * 2 // 3
    tail = keep - head
    return text[:head] + marker + (text[len(text) - tail :] if tail else ""), True


def _format_validation(name: str, err: pydantic.ValidationError) -> str:
    parts = []
    for e in err.errors(include_url=False):
        loc = ".".join(str(x) for x in e["loc"]) or "(arguments)"
        if e["type"] == "missing":
            parts.append(f"missing required argument {loc!r}")
        elif e["type"] == "extra_forbidden":
            parts.append(f"unexpected argument {loc!r}")
        else:
            got = repr(e.get("input"))
            if len(got) > 60:
                got = got[:57] + "..."
            parts.append(f"argument {loc!r}: {e['msg']} (got {got})")
    return f"invalid arguments for {name!r}: " + "; ".join(parts)


class ToolBox:
    """A set of tools with safe, timed dispatch.

    Every failure of a call — unknown tool, wrong types, missing or extra arguments,
    an exception inside the tool, a timeout, an output over ``max_output_chars`` —
    comes back as a ``ToolResult`` (``ok=False`` and ``error`` set, or ``truncated``).
    """

    def __init__(
        self,
        tools: Iterable[BoundTool | Callable[..., Any]] = (),
        timeout: float | None = 30.0,
        max_output_chars: int = 16_000,
    ):
        self._tools: dict[str, BoundTool] = {}
        self.timeout = timeout
        self.max_output_chars = max_output_chars
        for t in tools:
            self.add(t)

    @classmethod
    def from_object(cls, owner: Any, **kwargs: Any) -> ToolBox:
        return cls(tools_of(owner), **kwargs)

    def add(self, t: BoundTool | Callable[..., Any]) -> None:
        if not isinstance(t, BoundTool):
            definition = tool_def(t)
            if definition is None:
                definition = ToolDef(t)
            t = BoundTool(definition)
        if t.name in self._tools:
            raise ValueError(f"duplicate tool name {t.name!r}")
        self._tools[t.name] = t

    # ---- introspection ----
    def __contains__(self, name: str) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    @property
    def specs(self) -> list[ToolSpec]:
        return [t.spec for t in self._tools.values()]

    def get(self, name: str) -> BoundTool | None:
        return self._tools.get(name)

    def is_terminal(self, name: str) -> bool:
        t = self._tools.get(name)
        return bool(t and t.definition.terminal)

    # ---- dispatch ----
    async def call(self, call: ToolCall) -> ToolResult:
        start = time.perf_counter()
        res = await self._call(call)
        res.elapsed_s = time.perf_counter() - start
        res.call_id = call.id
        res.content, cut = truncate(res.content, self.max_output_chars)
        if res.error:  # errors may echo the arguments (a 2 MB "unknown city ..."): same cap as output
            res.error, err_cut = truncate(res.error, self.max_output_chars)
            cut = cut or err_cut
        res.truncated = res.truncated or cut
        return res

    async def _call(self, call: ToolCall) -> ToolResult:
        t = self._tools.get(call.name)
        if t is None:
            close = difflib.get_close_matches(call.name, self.names, n=3)
            hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            return ToolResult(
                name=call.name if invalid_unicode(call.name) is None else ascii(call.name)[:80],
                ok=False,
                error_kind="unknown_tool",
                error=f"unknown tool {call.name[:80]!r}.{hint} Available tools: {', '.join(self.names)}",
            )
        problem = json_problem(call.arguments)  # what no tool may see (the parsers refuse it first)
        try:
            if problem:
                raise BadArguments(problem)
            kwargs = t.definition.validate(call.arguments)
        except pydantic.ValidationError as e:
            return ToolResult(
                name=t.name, ok=False, error_kind="bad_arguments", error=_format_validation(t.name, e)
            )
        except Exception as e:  # noqa: BLE001 - BadArguments, or a validator that failed on odd input
            detail = str(e) if isinstance(e, BadArguments) else f"{type(e).__name__}: {e}"
            return ToolResult(
                name=t.name,
                ok=False,
                error_kind="bad_arguments",
                error=f"invalid arguments for {t.name!r}: {detail}",
            )
        timeout = t.definition.timeout if t.definition.timeout is not None else self.timeout
        try:
            if t.definition.is_async:
                value = await asyncio.wait_for(t(**kwargs), timeout)
            else:
                value = await asyncio.wait_for(asyncio.to_thread(t, **kwargs), timeout)
            if inspect.isawaitable(value):
                value = await asyncio.wait_for(value, timeout)
        except TimeoutError:
            return ToolResult(
                name=t.name, ok=False, error_kind="timeout", error=f"{t.name!r} timed out after {timeout}s"
            )
        except ToolError as e:
            return ToolResult(name=t.name, ok=False, error_kind="tool_error", error=str(e))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - any tool failure becomes an observation
            return ToolResult(
                name=t.name,
                ok=False,
                error_kind="exception",
                error=f"{t.name!r} raised {type(e).__name__}: {e}",
            )
        return _to_result(t.name, value)

    def call_sync(self, call: ToolCall) -> ToolResult:
        return asyncio.run(self.call(call))


def _to_result(name: str, value: Any) -> ToolResult:
    if isinstance(value, ToolResult):
        return value.model_copy(update={"name": value.name or name})
    if isinstance(value, ToolOutput):
        return ToolResult(name=name, content=value.text, images=list(value.images))
    if value is None:
        return ToolResult(name=name, content="")
    if isinstance(value, str):
        return ToolResult(name=name, content=value)
    if isinstance(value, pydantic.BaseModel):
        return ToolResult(name=name, content=value.model_dump_json())
    try:
        return ToolResult(name=name, content=json.dumps(value, ensure_ascii=False, default=str))
    except (TypeError, ValueError):
        return ToolResult(name=name, content=str(value))
