"""The model behind the proxy: a turngym token backend, its tokenizer's chat template and a tool-call parser.

``ProxyModel.sample`` asks the backend for ``n`` generations of one prompt (ids in, ids and raw
logprobs out: ``turngym.agents.backend``); ``ProxyModel.reply`` turns a generation's text into an
OpenAI assistant message, its tool calls parsed with the model's convention (``hermes`` by default,
any ``turngym.tools.parsers`` parser).

* Stop sequences: one that is a single token stops the backend there; any other is found in the
  decoded text after generation. Either way the returned text ends before the stop sequence and the
  recorded ids end with the token that completed it (what the model sampled).
* ``max_tokens`` is capped by the room the context leaves; a prompt that fills the context is a 400
  naming both numbers.
* Chat formats (the template with a request's tools rendered natively) are cached per tool list.
* Seeds: choice ``i`` of a request with ``seed`` samples with ``seed + i``.
"""

from __future__ import annotations

import json
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from turngym.agents.backend import SamplingParams
from turngym.agents.chat import ChatFormat
from turngym.core.types import Message, ToolCall
from turngym.proxy.wire import CallRequest, ProxyError
from turngym.tools.parsers import get_parser


@dataclass
class Sample:
    """One generation as recorded: sampled ids (cut at a stop sequence), their logprobs, the text returned."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str
    timing: dict[str, float] = field(default_factory=dict)


@dataclass
class Reply:
    """An assistant message for the harness, and whether its text held a tool call that failed to parse."""

    message: Message
    error: str = ""


class ProxyModel:
    """Backend + tokenizer + parser under one served model name."""

    def __init__(
        self,
        backend: Any,
        tokenizer: Any,
        *,
        name: str,
        max_context: int = 4096,
        max_tokens: int = 512,
        parser: str | Any = "hermes",
        template_kwargs: dict[str, Any] | None = None,
        aliases: tuple[str, ...] = (),
    ):
        self.backend = backend
        self.tokenizer = tokenizer
        self.name = name
        self.names = {name, *aliases}
        self.max_context = max_context
        self.max_tokens = max_tokens
        self.parser = get_parser(parser)
        self.template_kwargs = template_kwargs
        self._formats: OrderedDict[str, ChatFormat] = OrderedDict()
        self.text_format = self.chat_format([])

    def check_model(self, model: str) -> None:
        if model not in self.names:
            raise ProxyError(
                404,
                f"the model {model!r} does not exist; this proxy serves {self.name!r}",
                param="model",
                code="model_not_found",
            )

    def chat_format(self, tools: list[dict[str, Any]]) -> ChatFormat:
        """The chat format with ``tools`` rendered by the template (the same object for the same tools)."""
        key = json.dumps(tools, sort_keys=True)
        fmt = self._formats.get(key)
        if fmt is None:
            fmt = ChatFormat(self.tokenizer, tools=tools or None, template_kwargs=self.template_kwargs)
            self._formats[key] = fmt
            while len(self._formats) > 64:
                self._formats.popitem(last=False)
        else:
            self._formats.move_to_end(key)
        return fmt

    def room(self, prompt_len: int) -> int:
        room = self.max_context - prompt_len
        if room < 1:
            raise ProxyError(
                400,
                f"the prompt has {prompt_len} tokens but the model's context is {self.max_context} tokens "
                "(it needs room for at least one more)",
                param="messages",
                code="context_length_exceeded",
            )
        return room

    async def sample(
        self, fmt: ChatFormat, prompt_ids: list[int], req: CallRequest, route: str
    ) -> list[Sample]:
        """``req.n`` generations of ``prompt_ids`` sampled as ``req`` asks (see the module docstring)."""
        import asyncio

        room = self.room(len(prompt_ids))
        stop, seed = req.stop, req.seed
        stop_ids = set(fmt.stop_token_ids)
        for s in stop:
            ids = fmt.encode(s)
            if len(ids) == 1:
                stop_ids.add(ids[0])
        base = SamplingParams(
            max_tokens=min(req.max_tokens or self.max_tokens, room),
            temperature=req.temperature,
            top_p=req.top_p,
            stop_token_ids=tuple(sorted(stop_ids)),
        )
        gens = await asyncio.gather(
            *(
                self.backend.generate(
                    prompt_ids,
                    base.replace(seed=None if seed is None else seed + i),
                    route=route if i == 0 else f"{route}#{i}",
                )
                for i in range(req.n)
            )
        )
        out = []
        for gen in gens:
            ids, lps = list(gen.token_ids), list(gen.logprobs)
            text = fmt.decode(ids)
            finish = gen.finish_reason
            cut = _first_stop(text, stop)
            if cut is not None:
                k = _ids_through(fmt, ids, cut[0] + len(cut[1]))
                ids, lps, text, finish = ids[:k], lps[:k], text[: cut[0]], "stop"
            timing = {k: float(v) for k, v in (gen.meta.get("timing") or {}).items()}
            out.append(Sample(ids, lps, finish, text, timing))
        return out

    def reply(self, text: str, tools: list[dict[str, Any]], tool_choice: Any) -> Reply:
        """The assistant message for ``text``: its tool calls as ``tool_calls`` when tools are offered."""
        if not tools or tool_choice == "none":
            return Reply(Message(role="assistant", content=text))
        parsed = self.parser.parse(text)
        if not parsed.calls:
            return Reply(Message(role="assistant", content=text))
        if parsed.errors:
            return Reply(Message(role="assistant", content=text), error="; ".join(parsed.errors))
        calls = [
            ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", name=c.name, arguments=c.arguments)
            for c in parsed.valid_calls
        ]
        return Reply(Message(role="assistant", content=parsed.text, tool_calls=calls))


def _first_stop(text: str, stops: list[str]) -> tuple[int, str] | None:
    """The earliest stop sequence in ``text`` (its position and itself)."""
    found = [(text.find(s), s) for s in stops if s in text]
    return min(found) if found else None


def _ids_through(fmt: ChatFormat, ids: list[int], end: int) -> int:
    """The fewest leading ids whose text reaches ``end`` characters (binary search on decodes)."""
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(fmt.decode(ids[:mid])) >= end:
            hi = mid
        else:
            lo = mid + 1
    return hi
