"""OpenAI wire format for the proxy: request validation, message conversion and error bodies.

Requests are validated against the ``openai`` package's own request types
(``openai.types.chat.completion_create_params.CompletionCreateParamsBase`` and the legacy
``completion_create_params``) through pydantic, so the accepted shapes follow the SDK the harnesses
use. Nested lists in those types validate lazily; ``_materialize`` walks them so that every error
surfaces here, as a 400 whose ``param`` names the field (``messages[2].role``). Parameters the proxy
cannot honour (``response_format`` other than text, custom tools, image or audio parts, ``echo``,
several prompts) are refused the same way rather than silently ignored; vendor extras a harness may
add to the body (``extra_body``) are ignored.

``ChatRequest``/``TextRequest`` are what the rest of the proxy sees; messages become turngym
``Message``s (``developer`` -> ``system``, text parts joined, tool call arguments decoded).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

from turngym.core.types import Message, ToolCall


class ProxyError(Exception):
    """An OpenAI-style error: HTTP ``status`` and the ``error`` object's fields."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None, kind: str = ""
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind or _KINDS.get(status, "invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict[str, Any]:
        from openai.types.shared import ErrorObject

        err = ErrorObject(message=self.message, type=self.kind, param=self.param, code=self.code)
        return {"error": err.model_dump()}


_KINDS = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
    503: "server_error",
}


def invalid(message: str, param: str | None = None, code: str | None = None) -> ProxyError:
    return ProxyError(400, message, param=param, code=code)


@dataclass(kw_only=True)
class CallRequest:
    """What both call routes ask of the model: which model, how to sample, how to answer."""

    model: str
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    stop: list[str] = field(default_factory=list)
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None


@dataclass
class KnownMessages:
    """A chat request's messages as sent (JSON) and as converted. The next request of the episode
    resends them (a harness keeps its history): the part that is the same JSON is taken from here,
    and only the rest is validated and converted, so a call costs its new messages, not the history."""

    raw: list[Any] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)

    def shared(self, raw: list[Any]) -> int:
        """How many leading messages of ``raw`` are these, JSON for JSON."""
        n = min(len(self.raw), len(raw))
        return next((i for i in range(n) if self.raw[i] != raw[i]), n)


@dataclass(kw_only=True)
class ChatRequest(CallRequest):
    """A validated ``/v1/chat/completions`` request."""

    messages: list[Message]
    known: KnownMessages | None = None  # its messages, for the episode's next request
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    logprobs: bool = False
    top_logprobs: int = 0


@dataclass(kw_only=True)
class TextRequest(CallRequest):
    """A validated ``/v1/completions`` request (one prompt: text or token ids)."""

    prompt: str | list[int]
    max_tokens: int | None = 16
    logprobs: int | None = None


@functools.cache
def _chat_adapter() -> TypeAdapter:
    from openai.types.chat.completion_create_params import CompletionCreateParamsBase

    return TypeAdapter(CompletionCreateParamsBase)


@functools.cache
def _text_adapter() -> TypeAdapter:
    from openai.types.completion_create_params import CompletionCreateParamsBase

    return TypeAdapter(CompletionCreateParamsBase)


def _param(loc: tuple[Any, ...]) -> str:
    """``("messages", 2, "ChatCompletionUserMessageParam", "role")`` -> ``messages[2].role``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and (part[:1].isupper() or "[" in part):  # a union member's name
            continue
        else:
            out += ("." if out else "") + str(part)
    return out


def _raise_validation(e: ValidationError, prefix: tuple[Any, ...] = (), shift: int = 0) -> None:
    """A 400 naming the first bad field; ``shift``: added to the item index the error's loc starts
    with (the items were validated from ``shift`` on)."""
    errors = e.errors(include_url=False)
    by_param: dict[str, list[str]] = {}
    for err in errors:
        loc = tuple(err["loc"])
        if shift and loc and isinstance(loc[0], int):
            loc = (loc[0] + shift, *loc[1:])
        by_param.setdefault(_param((*prefix, *loc)), []).append(err["msg"])
    param, msgs = next(iter(by_param.items()))
    unique = list(dict.fromkeys(msgs))
    raise invalid(f"invalid value for {param or 'the body'}: {' | '.join(unique[:6])}", param or None)


def _materialize(value: Any, loc: tuple[Any, ...], first: int = 0) -> Any:
    """Plain lists and dicts from a validated value, running the lazy validators on the way
    (``first``: the index of an iterable's first item in the request)."""
    if isinstance(value, Iterator):  # pydantic's lazy ValidatorIterator (an Iterable field)
        items = []
        try:
            for i, item in enumerate(value, first):
                items.append(_materialize(item, (*loc, i)))
        except ValidationError as e:
            _raise_validation(e, loc, first)  # the error's own loc starts at the item index
        return items
    if isinstance(value, dict):
        return {k: _materialize(v, (*loc, k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_materialize(v, (*loc, i)) for i, v in enumerate(value)]
    return value


def _validated(body: Any, adapter: TypeAdapter, first: dict[str, int] | None = None) -> dict[str, Any]:
    """``body`` validated by ``adapter``; ``first``: where a list field's items start in the request
    (the body holds only the rest of them)."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    try:
        data = adapter.validate_python(body)
    except ValidationError as e:
        _raise_validation(e)
    first = first or {}
    return {k: _materialize(v, (k,), first.get(k, 0)) for k, v in data.items()}


def _stream_flags(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise invalid("stream must be a boolean", "stream")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise invalid("stream_options must be an object", "stream_options")
    return bool(stream), bool(opts.get("include_usage"))


def _stops(stop: Any) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else list(stop)
    if len(stops) > 4:
        raise invalid("stop takes at most 4 sequences", "stop")
    if any(not s for s in stops):
        raise invalid("stop sequences must not be empty", "stop")
    return stops


def _common(data: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """The ``CallRequest`` fields of a validated request (``body``: the raw one, for the stream flags)."""
    n = 1 if data.get("n") is None else data["n"]
    if not 1 <= n <= 16:
        raise invalid(f"n must be between 1 and 16, got {n}", "n")
    temperature = 1.0 if data.get("temperature") is None else float(data["temperature"])
    if not 0 <= temperature <= 2:
        raise invalid(f"temperature must be between 0 and 2, got {temperature}", "temperature")
    top_p = 1.0 if data.get("top_p") is None else float(data["top_p"])
    if not 0 < top_p <= 1:
        raise invalid(f"top_p must be in (0, 1], got {top_p}", "top_p")
    stream, include_usage = _stream_flags(body)
    return {
        "model": data["model"],
        "n": n,
        "stream": stream,
        "include_usage": include_usage,
        "stop": _stops(data.get("stop")),
        "temperature": temperature,
        "top_p": top_p,
        "seed": data.get("seed"),
    }


def _max_tokens(value: Any, param: str) -> int | None:
    if value is None:
        return None
    if value < 1:
        raise invalid(f"{param} must be >= 1, got {value}", param)
    return int(value)


def parse_chat_request(body: Any, known: KnownMessages | None = None) -> ChatRequest:
    """A ``ChatRequest`` from a JSON body, or ``ProxyError`` (400) naming the bad field; ``known``:
    the episode's previous request's messages (the same result, less work: ``KnownMessages``)."""
    raw = body.get("messages") if isinstance(body, dict) else None
    k = known.shared(raw) if known is not None and isinstance(raw, list) else 0
    data = _validated({**body, "messages": raw[k:]} if k else body, _chat_adapter(), {"messages": k})
    fmt = data.get("response_format")
    if fmt and fmt.get("type") != "text":
        raise invalid(f"response_format {fmt.get('type')!r} is not supported (text only)", "response_format")
    tools = []
    for i, tool in enumerate(data.get("tools") or []):
        if tool.get("type") != "function":
            raise invalid("only function tools are supported", f"tools[{i}].type")
        fn = dict(tool["function"])
        fn.setdefault("parameters", {"type": "object", "properties": {}})
        tools.append({"type": "function", "function": fn})
    tool_choice: Any = data.get("tool_choice") or ("auto" if tools else "none")
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name")
        if tool_choice.get("type") != "function" or name not in {t["function"]["name"] for t in tools}:
            raise invalid("tool_choice names no function of tools", "tool_choice")
    max_tokens = _max_tokens(data.get("max_completion_tokens"), "max_completion_tokens")
    if max_tokens is None:
        max_tokens = _max_tokens(data.get("max_tokens"), "max_tokens")
    top_logprobs = data.get("top_logprobs") or 0  # accepted; only the sampled token's logprob comes back
    if not 0 <= top_logprobs <= 20:
        raise invalid("top_logprobs must be between 0 and 20", "top_logprobs")
    earlier = known.messages[:k] if known is not None and k else []
    messages = [*earlier, *to_messages(data["messages"], earlier)]
    if not messages:
        raise invalid("messages must not be empty", "messages")
    return ChatRequest(
        messages=messages,
        known=KnownMessages(list(raw), messages) if isinstance(raw, list) else None,
        tools=tools,
        tool_choice=tool_choice,
        max_tokens=max_tokens,
        logprobs=bool(data.get("logprobs")),
        top_logprobs=top_logprobs,
        **_common(data, body),
    )


def parse_text_request(body: Any) -> TextRequest:
    """A ``TextRequest`` from a ``/v1/completions`` JSON body, or ``ProxyError`` (400)."""
    data = _validated(body, _text_adapter())
    if data.get("echo"):
        raise invalid("echo is not supported", "echo")
    if data.get("suffix"):
        raise invalid("suffix is not supported", "suffix")
    if (data.get("best_of") or 1) != 1:
        raise invalid("best_of is not supported", "best_of")
    prompt = data["prompt"]
    if isinstance(prompt, list):
        if len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        elif not all(isinstance(t, int) for t in prompt):
            raise invalid("one prompt per request (a string or a list of token ids)", "prompt")
    if not prompt:
        raise invalid("the prompt is empty", "prompt")
    logprobs = data.get("logprobs")
    if logprobs is not None and not 0 <= logprobs <= 5:
        raise invalid("logprobs must be between 0 and 5", "logprobs")
    return TextRequest(
        prompt=prompt,
        max_tokens=_max_tokens(data.get("max_tokens", 16), "max_tokens"),
        logprobs=logprobs,
        **_common(data, body),
    )


def _text(content: Any, param: str) -> str:
    """A message's content as text: a string, or the text (and refusal) parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type")
        if kind == "text":
            parts.append(part["text"])
        elif kind == "refusal":
            parts.append(part["refusal"])
        else:
            raise invalid(f"{kind} content parts are not supported (text only)", f"{param}[{j}].type")
    return "".join(parts)


def to_messages(raw: list[dict[str, Any]], earlier: Sequence[Message] = ()) -> list[Message]:
    """OpenAI message params -> turngym ``Message``s (400 naming the message on what cannot map);
    ``earlier``: the request's messages before ``raw``, already converted."""
    out: list[Message] = []
    # tool call id -> function name (a tool message's name)
    names = {c.id: c.name for m in earlier for c in m.tool_calls}
    for i, m in enumerate(raw, len(earlier)):
        role = m["role"]
        content = _text(m.get("content"), f"messages[{i}].content")
        if role in ("system", "developer", "user"):
            out.append(
                Message(role="user" if role == "user" else "system", content=content, name=m.get("name"))
            )
        elif role == "assistant":
            calls = []
            for j, tc in enumerate(m.get("tool_calls") or []):
                if tc.get("type") != "function":
                    raise invalid("only function tool calls are supported", f"messages[{i}].tool_calls[{j}]")
                fn = tc["function"]
                try:
                    args = json.loads(fn["arguments"]) if fn["arguments"].strip() else {}
                except json.JSONDecodeError as e:
                    raise invalid(
                        f"arguments are not valid JSON: {e}",
                        f"messages[{i}].tool_calls[{j}].function.arguments",
                    ) from None
                if not isinstance(args, dict):
                    raise invalid(
                        "arguments must be a JSON object", f"messages[{i}].tool_calls[{j}].function.arguments"
                    )
                calls.append(ToolCall(id=tc["id"], name=fn["name"], arguments=args))
                names[tc["id"]] = fn["name"]
            out.append(Message(role="assistant", content=content, tool_calls=calls))
        elif role == "tool":
            call_id = m["tool_call_id"]
            out.append(Message(role="tool", content=content, tool_call_id=call_id, name=names.get(call_id)))
        else:
            raise invalid(f"{role} messages are not supported", f"messages[{i}].role")
    return out
