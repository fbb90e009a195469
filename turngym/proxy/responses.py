"""OpenAI response objects from a ``CallResult``, built with the ``openai`` package's own types.

``chat_completion``/``chat_chunks`` (``stream: true``: the finished generation as SSE chunks: the
role and content, each tool call, the finish reason, then usage when ``stream_options.include_usage``)
and ``text_completion``/``text_chunks`` for ``/v1/completions``. Logprobs are the backend's raw
log-probabilities of the sampled tokens (temperature 1, before top-p); ``top_logprobs`` are not
computed by turngym's backends and come back empty.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from openai.types import Completion, CompletionChoice, CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionTokenLogprob
from openai.types.chat.chat_completion import Choice, ChoiceLogprobs
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
from openai.types.chat.chat_completion_chunk import (
    ChoiceDelta,
    ChoiceDeltaToolCall,
    ChoiceDeltaToolCallFunction,
)
from openai.types.chat.chat_completion_message import ChatCompletionMessage
from openai.types.chat.chat_completion_message_function_tool_call import (
    ChatCompletionMessageFunctionToolCall,
    Function,
)
from openai.types.completion_choice import Logprobs

from turngym.proxy.model import Reply, Sample
from turngym.proxy.service import CallResult


def _usage(result: CallResult) -> CompletionUsage:
    return CompletionUsage(
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
        total_tokens=result.prompt_tokens + result.completion_tokens,
    )


def _envelope(result: CallResult, prefix: str, *, usage: bool = True) -> dict[str, Any]:
    """The fields every response object of a call shares (its id, time, model; its usage)."""
    head: dict[str, Any] = {"id": prefix + result.id, "created": result.created, "model": result.model}
    return head | {"usage": _usage(result)} if usage else head


def _token_text(tokenizer: Any, tid: int) -> str:
    return tokenizer.decode([tid], skip_special_tokens=False)


def _chat_logprobs(tokenizer: Any, sample: Sample) -> ChoiceLogprobs:
    content = []
    for tid, lp in zip(sample.token_ids, sample.logprobs, strict=True):
        tok = _token_text(tokenizer, tid)
        content.append(
            ChatCompletionTokenLogprob(token=tok, bytes=list(tok.encode()), logprob=lp, top_logprobs=[])
        )
    return ChoiceLogprobs(content=content)


def _finish(sample: Sample, reply: Reply) -> str:
    return "tool_calls" if reply.message.tool_calls else sample.finish_reason


def _tool_calls(reply: Reply) -> list[ChatCompletionMessageFunctionToolCall] | None:
    calls = [
        ChatCompletionMessageFunctionToolCall(
            id=c.id,
            type="function",
            function=Function(name=c.name, arguments=json.dumps(c.arguments, ensure_ascii=False)),
        )
        for c in reply.message.tool_calls
    ]
    return calls or None


def _content(reply: Reply) -> str | None:
    return reply.message.content if (reply.message.content or not reply.message.tool_calls) else None


def chat_completion(result: CallResult, tokenizer: Any, *, logprobs: bool) -> ChatCompletion:
    choices = [
        Choice(
            index=i,
            message=ChatCompletionMessage(role="assistant", content=_content(r), tool_calls=_tool_calls(r)),
            finish_reason=_finish(s, r),  # type: ignore[arg-type]
            logprobs=_chat_logprobs(tokenizer, s) if logprobs else None,
        )
        for i, (s, r) in enumerate(zip(result.samples, result.replies, strict=True))
    ]
    return ChatCompletion(object="chat.completion", choices=choices, **_envelope(result, "chatcmpl-"))


def chat_chunks(
    result: CallResult, tokenizer: Any, *, logprobs: bool, include_usage: bool
) -> Iterator[ChatCompletionChunk]:
    def chunk(choices: list[ChunkChoice], usage: CompletionUsage | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            object="chat.completion.chunk",
            choices=choices,
            usage=usage,
            **_envelope(result, "chatcmpl-", usage=False),
        )

    for i, (s, r) in enumerate(zip(result.samples, result.replies, strict=True)):
        yield chunk(
            [
                ChunkChoice(
                    index=i,
                    delta=ChoiceDelta(role="assistant", content=_content(r)),
                    logprobs=_chat_logprobs(tokenizer, s) if logprobs else None,  # type: ignore[arg-type]
                )
            ]
        )
        for j, tc in enumerate(_tool_calls(r) or []):
            delta = ChoiceDelta(
                tool_calls=[
                    ChoiceDeltaToolCall(
                        index=j,
                        id=tc.id,
                        type="function",
                        function=ChoiceDeltaToolCallFunction(
                            name=tc.function.name, arguments=tc.function.arguments
                        ),
                    )
                ]
            )
            yield chunk([ChunkChoice(index=i, delta=delta)])
        yield chunk([ChunkChoice(index=i, delta=ChoiceDelta(), finish_reason=_finish(s, r))])  # type: ignore[arg-type]
    if include_usage:
        yield chunk([], _usage(result))


def _text_logprobs(tokenizer: Any, sample: Sample) -> Logprobs:
    tokens = [_token_text(tokenizer, t) for t in sample.token_ids]
    offsets, pos = [], 0
    for tok in tokens:
        offsets.append(pos)
        pos += len(tok)
    return Logprobs(
        tokens=tokens, token_logprobs=list(sample.logprobs), text_offset=offsets, top_logprobs=None
    )


def text_completion(result: CallResult, tokenizer: Any, *, logprobs: bool) -> Completion:
    choices = [
        CompletionChoice(
            index=i,
            text=s.text,
            finish_reason=s.finish_reason,  # type: ignore[arg-type]
            logprobs=_text_logprobs(tokenizer, s) if logprobs else None,
        )
        for i, s in enumerate(result.samples)
    ]
    return Completion(object="text_completion", choices=choices, **_envelope(result, "cmpl-"))


def text_chunks(
    result: CallResult, tokenizer: Any, *, logprobs: bool, include_usage: bool
) -> Iterator[Completion]:
    whole = text_completion(result, tokenizer, logprobs=logprobs)
    for choice in whole.choices:
        yield whole.model_copy(update={"choices": [choice], "usage": None})
    if include_usage:
        yield whole.model_copy(update={"choices": []})
