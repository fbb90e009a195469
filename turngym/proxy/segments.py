"""Token-exact sequences from calls: does a call continue the episode's sequence, or start a new segment?

An episode's calls build token sequences the way the rollout engine builds a trajectory's
(``turngym.agents.chat.ChatTokens``): the first prompt is the chat template's rendering, the sampled
ids are kept exactly as sampled (loss mask 1), and what the harness adds after the model's reply
(tool results, a user turn) is the template's delta (loss mask 0). The model is always prompted with
that sequence, so what it saw is what is recorded.

A chat call *continues* the segment when its messages are the segment's messages, then the reply the
proxy returned (the harness may re-send it with its own tool-call ids), then anything new; and the
template's rendering of that extends the previous one. Anything else starts a new segment, prompted
with a fresh rendering, and the break is a ``Drift`` saying why and where: the first message that
differs and the first token where the new prompt leaves the old sequence. Reasons:

* ``history_changed``: a message before the last reply was changed or dropped;
* ``reply_changed``: the harness altered the reply the proxy returned (or left it out);
* ``template``: the chat template re-renders history (``TokenMismatch``);
* ``tools_changed``: the request's tool list differs from the segment's;
* ``api_changed``: a chat call after a completions call (or the other way round).

``TextTokens`` does the same for ``/v1/completions``: a prompt that starts with the previous prompt
and the returned text continues (only the new text is encoded); a list of token ids continues when it
extends the previous ids token for token.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

from turngym.agents.chat import ChatFormat, ChatTokens, TokenMismatch
from turngym.core.types import Message


@dataclass
class Drift:
    """Why a call could not continue the segment, and where its prompt left it."""

    reason: str
    message: int | None = None  # index of the first request message that differs
    token: int | None = None  # first token where the new prompt leaves the old sequence
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "message": self.message, "token": self.token, "detail": self.detail}


@dataclass
class Candidate:
    """One sampled reply of the last call (``n`` > 1 gives several) and the sequence that ends with it."""

    tokens: ChatTokens | TextTokens
    action: Message
    text: str
    gen_span: tuple[int, int]


@dataclass
class Plan:
    """How the next call's prompt is built: a sequence (a fresh copy, committed only if the call succeeds)."""

    tokens: ChatTokens | TextTokens
    continued: bool
    chosen: int = 0  # the candidate of the previous call that the harness went on with
    observation: list[Message] = field(default_factory=list)
    obs_span: tuple[int, int] | None = None
    drift: Drift | None = None


def _same(a: Message, b: Message) -> bool:
    # the same object: a message the episode's previous request sent as well (``KnownMessages``)
    return a is b or a.model_dump(exclude={"images"}) == b.model_dump(exclude={"images"})


def _same_reply(sent: Message, ours: Message) -> bool:
    """The harness's copy of a reply equals the one returned (tool-call ids and whitespace aside)."""
    if sent.role != "assistant" or sent.content.strip() != ours.content.strip():
        return False
    calls = [(c.name, c.arguments) for c in sent.tool_calls]
    return calls == [(c.name, c.arguments) for c in ours.tool_calls]


def _first_diff(old: Any, new: Any) -> int:
    n = min(len(old), len(new))
    return next((i for i in range(n) if old[i] != new[i]), n)


def plan_chat(
    fmt: ChatFormat, messages: list[Message], segment: list[Candidate] | None, segment_fmt: ChatFormat | None
) -> Plan:
    """Continue ``segment`` (the last call's candidates) with ``messages``, or start a new segment."""
    if not segment:
        return Plan(ChatTokens(fmt, messages), continued=False)
    drift = None
    base = segment[0].tokens
    known = getattr(base, "messages", [])  # the segment's messages before the last reply
    k = len(known)
    if not isinstance(base, ChatTokens):
        drift = Drift("api_changed", detail="a chat call after a completions call")
    elif segment_fmt is not fmt:
        drift = Drift("tools_changed", detail="the request's tools differ from the segment's")
    else:
        k_diff = next((i for i in range(min(k, len(messages))) if not _same(known[i], messages[i])), None)
        if k_diff is not None or len(messages) < k:
            at = k_diff if k_diff is not None else len(messages)
            drift = Drift("history_changed", message=at, detail=f"message {at} differs from the segment's")
        elif len(messages) == k:
            drift = Drift("reply_changed", message=k, detail="the conversation ends before the reply")
        else:
            chosen = next((i for i, c in enumerate(segment) if _same_reply(messages[k], c.action)), None)
            if chosen is None:
                drift = Drift("reply_changed", message=k, detail=f"message {k} is not the reply returned")
            else:
                tokens = segment[chosen].tokens.copy()
                observation = messages[k + 1 :]
                try:
                    span = tokens.add_observation(messages[k], observation)
                except TokenMismatch as e:
                    drift = Drift("template", message=k, detail=str(e).splitlines()[0])
                else:
                    return Plan(tokens, True, chosen, list(observation), span)
    fresh = ChatTokens(fmt, messages)
    drift.token = _first_diff(base.token_ids, fresh.token_ids)
    return Plan(fresh, continued=False, drift=drift)


class TextTokens:
    """A ``/v1/completions`` sequence: ids, loss mask, logprobs, and the text the harness knows."""

    retokenization_drift = 0

    def __init__(self, fmt: ChatFormat, prompt: str | list[int]):
        self.fmt = fmt
        ids = fmt.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self.token_ids = array("i", ids)
        self.loss_mask = array("b", bytes(len(ids)))
        self.logprobs = array("d", bytes(8 * len(ids)))
        self.prompt_len = len(ids)
        self.text: str | None = prompt if isinstance(prompt, str) else None

    def __len__(self) -> int:
        return len(self.token_ids)

    def copy(self) -> TextTokens:
        new = object.__new__(TextTokens)
        new.__dict__.update(self.__dict__)
        new.token_ids = array("i", self.token_ids)
        new.loss_mask = array("b", self.loss_mask)
        new.logprobs = array("d", self.logprobs)
        return new

    def add_generation(self, token_ids: list[int], logprobs: list[float], text: str) -> tuple[int, int]:
        start = len(self.token_ids)
        self.token_ids.extend(token_ids)
        self.loss_mask.extend(b"\x01" * len(token_ids))
        self.logprobs.extend(float(x) for x in logprobs)
        if self.text is not None:
            self.text += text
        return start, len(self.token_ids)

    def extend_to(self, prompt: str | list[int]) -> tuple[int, int] | None:
        """Append what ``prompt`` adds to this sequence (loss mask 0); None if it does not extend it."""
        if isinstance(prompt, str):
            if self.text is None or not prompt.startswith(self.text):
                return None
            new = self.fmt.encode(prompt[len(self.text) :]) if len(prompt) > len(self.text) else []
            self.text = prompt
        else:
            n = len(self.token_ids)
            if len(prompt) < n or array("i", prompt[:n]) != self.token_ids:
                return None
            new = list(prompt[n:])
        start = len(self.token_ids)
        self.token_ids.extend(new)
        self.loss_mask.extend(bytes(len(new)))
        self.logprobs.extend(array("d", bytes(8 * len(new))))
        return start, len(self.token_ids)


def plan_text(fmt: ChatFormat, prompt: str | list[int], segment: list[Candidate] | None) -> Plan:
    """Continue a completions segment with ``prompt`` (any candidate it extends), or start a new one."""
    if not segment:
        return Plan(TextTokens(fmt, prompt), continued=False)
    for i, cand in enumerate(segment):
        tokens = cand.tokens.copy()
        if isinstance(tokens, TextTokens):
            span = tokens.extend_to(prompt)
            if span is not None:
                return Plan(tokens, True, i, obs_span=span)
    fresh = TextTokens(fmt, prompt)
    drift = Drift("history_changed", token=_first_diff(segment[0].tokens.token_ids, fresh.token_ids))
    drift.detail = "the prompt does not extend the previous prompt and completion"
    return Plan(fresh, continued=False, drift=drift)
