"""Tool-call parsers: model output -> tool calls, each with an explicit status.

A parser never raises on model output: anything it cannot read becomes a
``ParsedCall`` with ``status != "ok"`` and an error message for the model.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from turngym.core.types import Message, ToolCall, ToolResult
from turngym.tools.arguments import call_problem, invalid_unicode

Status = Literal["ok", "invalid_json", "invalid_call", "unclosed"]


@dataclass
class ParsedCall:
    status: Status
    raw: str
    call: ToolCall | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass
class ParseResult:
    calls: list[ParsedCall] = field(default_factory=list)
    text: str = ""  # the action's text outside tool calls

    @property
    def valid_calls(self) -> list[ToolCall]:
        return [c.call for c in self.calls if c.ok and c.call is not None]

    @property
    def errors(self) -> list[str]:
        return [c.error or c.status for c in self.calls if not c.ok]


class ToolCallParser(Protocol):
    name: str

    def parse(self, action: str | Message) -> ParseResult: ...

    def format_result(self, result: ToolResult) -> Message: ...

    def format_error(self, error: str) -> Message: ...

    def format_call(self, call: ToolCall) -> str | Message: ...

    def instructions(self, tools: list[Any]) -> str: ...

    def call_hint(self, tools: list[Any]) -> str: ...


def _as_call(obj: Any, raw: str) -> ParsedCall:
    """Validate a decoded ``{"name":..., "arguments":{...}}`` object."""
    if not isinstance(obj, dict):
        return ParsedCall(
            "invalid_call", raw, error=f"a tool call must be a JSON object, got {type(obj).__name__}"
        )
    name = obj.get("name")
    if "function" in obj and isinstance(obj["function"], dict) and name is None:  # OpenAI nesting
        return _as_call({**obj["function"], "id": obj.get("id")}, raw)
    if not isinstance(name, str) or not name.strip():
        return ParsedCall("invalid_call", raw, error='a tool call needs a "name" string')
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # OpenAI style: arguments as a JSON string
        try:
            args = _loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            return ParsedCall(
                "invalid_json", raw, error=f"arguments of {name[:80]!r} are not valid JSON: {e}"
            )
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return ParsedCall(
            "invalid_call",
            raw,
            error=f'"arguments" of {name[:80]!r} must be an object, got {type(args).__name__}',
        )
    problem = call_problem(name, args)
    if problem:  # e.g. a lone surrogate from a "\\ud800" escape: no tool may see it, nothing can encode it
        return ParsedCall("invalid_call", raw, error=f"invalid call of {name[:80]!r}: {problem}")
    call_id = obj.get("id") if isinstance(obj.get("id"), str) and invalid_unicode(obj["id"]) is None else ""
    return ParsedCall("ok", raw, call=ToolCall(id=call_id, name=name.strip(), arguments=args))


def _loads(text: str) -> Any:
    """``json.loads``, whose every failure is a ``JSONDecodeError``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError as e:  # deeply nested input
        raise json.JSONDecodeError("nesting too deep", text, 0) from e
    except ValueError as e:  # an integer of more than 4,300 digits (CPython's limit)
        raise json.JSONDecodeError(f"a number too long to read ({str(e)[:60]})", text, 0) from e


def _raw(obj: Any) -> str:
    """A call as text for ``ParsedCall.raw`` (non-ASCII escaped, so a lone surrogate cannot break it)."""
    try:
        return json.dumps(obj, default=repr)
    except (ValueError, RecursionError, TypeError):  # nested too deep for the encoder
        return "<a call that cannot be written as JSON>"


def _structured(call: ToolCall) -> ParsedCall:
    """A ``ToolCall`` from ``Message.tool_calls``: ok, or invalid when it holds what JSON cannot."""
    raw = _raw({"id": call.id, "name": call.name, "arguments": call.arguments})
    problem = call_problem(call.name, call.arguments)
    if problem:
        return ParsedCall("invalid_call", raw, error=f"invalid call of {call.name[:80]!r}: {problem}")
    if not call.name.strip():
        return ParsedCall("invalid_call", raw, error='a tool call needs a "name" string')
    if invalid_unicode(call.id) is not None:  # the env gives it an id of its own
        call = call.model_copy(update={"id": ""})
    return ParsedCall("ok", raw, call=call)


class HermesParser:
    """Hermes/Qwen convention: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, several per turn."""

    name = "hermes"
    _BLOCK = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)

    def parse(self, action: str | Message) -> ParseResult:
        if isinstance(action, Message):
            if action.tool_calls:
                return OpenAIParser().parse(action)
            action = action.content
        if not isinstance(action, str):
            return ParseResult(
                [ParsedCall("invalid_call", repr(action), error="the action must be text or a Message")]
            )
        calls: list[ParsedCall] = []
        outside: list[str] = []
        pos = 0
        for m in self._BLOCK.finditer(action):
            outside.append(action[pos : m.start()])
            pos = m.end()
            body, closed = m.group(1), bool(m.group(2))
            raw = m.group(0)
            if not closed:
                calls.append(ParsedCall("unclosed", raw, error="<tool_call> was opened but never closed"))
                continue
            body = body.strip()
            if body.startswith("```"):  # tolerate a fenced block inside the tags
                body = body.strip("`").removeprefix("json").strip()
            try:
                obj = _loads(body)
            except json.JSONDecodeError as e:
                calls.append(ParsedCall("invalid_json", raw, error=f"the tool call is not valid JSON: {e}"))
                continue
            calls.append(_as_call(obj, raw))
        outside.append(action[pos:])
        return ParseResult(calls, "".join(outside).strip())

    def format_result(self, result: ToolResult) -> Message:
        return Message(
            role="tool",
            content=_result_text(result),
            name=result.name,
            tool_call_id=result.call_id or None,
            images=list(result.images),
        )

    def format_error(self, error: str) -> Message:
        return Message(role="tool", content=f"Error: {error}")

    def format_call(self, call: ToolCall) -> str:
        """The call as a model writes it in this convention (experts, scripted agents, IGPO's answer frame)."""
        body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
        return f"<tool_call>{body}</tool_call>"

    def instructions(self, tools: list[Any]) -> str:
        specs = "\n".join(_spec_json(t) for t in tools)
        return (
            "You may call one or more functions. Function signatures:\n<tools>\n"
            f"{specs}\n</tools>\n"
            "For each call, write a JSON object with the function name and arguments inside tags:\n"
            '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        )

    def call_hint(self, tools: list[Any]) -> str:
        """One line saying how to write a call here (an action with no call gets it back)."""
        return f'Call a tool as <tool_call>{{"name": ..., "arguments": {{...}}}}</tool_call>. Tools: {_names(tools)}'


class OpenAIParser:
    """Structured ``tool_calls`` on an assistant ``Message`` (OpenAI function calling)."""

    name = "openai"

    def parse(self, action: str | Message) -> ParseResult:
        if isinstance(action, str):  # a JSON list/object of calls in text
            try:
                obj = _loads(action)
            except json.JSONDecodeError as e:
                return ParseResult([ParsedCall("invalid_json", action, error=f"not valid JSON: {e}")])
            items = obj if isinstance(obj, list) else [obj]
            return ParseResult([_as_call(o, _raw(o)) for o in items])
        return ParseResult([_structured(c) for c in action.tool_calls], action.content)

    format_result = HermesParser.format_result
    format_error = HermesParser.format_error

    def format_call(self, call: ToolCall) -> Message:
        return Message(role="assistant", tool_calls=[call])

    def instructions(self, tools: list[Any]) -> str:
        return ""  # the API passes tools natively

    def call_hint(self, tools: list[Any]) -> str:
        return f"Call a tool through the message's structured tool_calls. Tools: {_names(tools)}"


class TagParser:
    """Tag protocol (Search-R1 style): ``<search>q</search>``, ``<answer>a</answer>``.

    ``tags`` maps a tag to ``(tool name, argument name)``. Results come back wrapped in
    ``result_tag`` (``<information>...</information>``) as a user message.
    """

    name = "tags"

    def __init__(
        self,
        tags: dict[str, tuple[str, str]] | None = None,
        result_tag: str = "information",
        first_only: bool = True,
    ):
        self.tags = tags or {"search": ("search", "query"), "answer": ("answer", "text")}
        self.result_tag = result_tag
        self.first_only = first_only
        names = "|".join(re.escape(t) for t in self.tags)
        self._open = re.compile(rf"<({names})>", re.DOTALL)

    def parse(self, action: str | Message) -> ParseResult:
        text = action.content if isinstance(action, Message) else action
        if not isinstance(text, str):
            return ParseResult([ParsedCall("invalid_call", repr(text), error="the action must be text")])
        calls: list[ParsedCall] = []
        outside: list[str] = []
        pos = 0
        while True:
            m = self._open.search(text, pos)
            if m is None:
                break
            tag = m.group(1)
            close = text.find(f"</{tag}>", m.end())
            outside.append(text[pos : m.start()])
            if close < 0:
                calls.append(
                    ParsedCall("unclosed", text[m.start() :], error=f"<{tag}> was opened but never closed")
                )
                pos = len(text)
                break
            raw = text[m.start() : close + len(tag) + 3]
            tool_name, arg = self.tags[tag]
            value = text[m.end() : close].strip()
            problem = call_problem(tool_name, {arg: value})
            if problem:
                calls.append(ParsedCall("invalid_call", ascii(raw)[:200], error=f"<{tag}>: {problem}"))
            else:
                calls.append(ParsedCall("ok", raw, call=ToolCall(name=tool_name, arguments={arg: value})))
            pos = close + len(tag) + 3
            if self.first_only:
                break
        outside.append(text[pos:])
        return ParseResult(calls, "".join(outside).strip())

    def format_result(self, result: ToolResult) -> Message:
        return Message(
            role="user",
            content=f"<{self.result_tag}>{_result_text(result)}</{self.result_tag}>",
            images=list(result.images),
        )

    def format_error(self, error: str) -> Message:
        return Message(role="user", content=f"<{self.result_tag}>Error: {error}</{self.result_tag}>")

    def format_call(self, call: ToolCall) -> str:
        """``<tag> value </tag>`` for the tag that maps to the call's tool; a tool with no tag, or a
        call with more than the tag's one argument, cannot be written in this protocol."""
        for tag, (tool_name, arg) in self.tags.items():
            if tool_name == call.name:
                extra = set(call.arguments) - {arg}
                if extra:
                    raise ValueError(
                        f"the tag protocol carries one argument of {call.name} ({arg}), not {extra}"
                    )
                return f"<{tag}> {call.arguments.get(arg, '')} </{tag}>"
        raise ValueError(f"no tag calls the tool {call.name!r} (tags: {sorted(self.tags)})")

    def instructions(self, tools: list[Any]) -> str:
        parts = [f"<{tag}>…</{tag}> calls {tool}({arg}=…)" for tag, (tool, arg) in self.tags.items()]
        return (
            "Use tags to act: " + "; ".join(parts) + f". Results come back inside <{self.result_tag}> tags."
        )

    def call_hint(self, tools: list[Any]) -> str:
        return self.instructions(tools)


def render_calls(parser: ToolCallParser, calls: list[ToolCall]) -> str | Message:
    """One turn's calls as one action in ``parser``'s convention: text calls joined by newlines,
    structured ones in one assistant message. ``ValueError`` when the convention cannot carry a call."""
    rendered = [parser.format_call(c) for c in calls]
    if all(isinstance(r, str) for r in rendered):
        return "\n".join(rendered)  # type: ignore[arg-type]
    structured = [c for r in rendered if isinstance(r, Message) for c in r.tool_calls or []]
    return Message(role="assistant", tool_calls=structured)


def _names(tools: list[Any]) -> str:
    return ", ".join(getattr(t, "name", str(t)) for t in tools)


def _result_text(result: ToolResult) -> str:
    if result.ok:
        return result.content
    return f"Error: {result.error}" + (f"\n{result.content}" if result.content else "")


PARSERS: dict[str, type] = {"hermes": HermesParser, "openai": OpenAIParser, "tags": TagParser}


#: the convention an env or agent uses when nothing names one
DEFAULT_PARSER = "hermes"


def get_parser(spec: str | ToolCallParser | None = None) -> ToolCallParser:
    """A parser by name (``hermes``, ``openai``, ``tags``) or the instance given; None: the default."""
    if spec is None:
        spec = DEFAULT_PARSER
    if isinstance(spec, str):
        try:
            return PARSERS[spec]()
        except KeyError:
            raise ValueError(f"unknown tool-call parser {spec!r}; choose one of {sorted(PARSERS)}") from None
    return spec


def _spec_json(t: Any) -> str:
    """A tool's OpenAI schema as one JSON line (a ``ToolSpec``'s kept text where it has one)."""
    dump = getattr(t, "openai_json", None)
    return dump() if dump is not None else json.dumps(t.to_openai(), ensure_ascii=False)
