"""``Proxy``: one OpenAI-style call, end to end: the episode's sequence, the backend, the record.

    proxy = Proxy(ProxyModel(backend, tokenizer, name="tiny"), EpisodeStore(...))
    result = await proxy.chat("episode-7", parse_chat_request(body))

The call waits for the episode's earlier calls (calls of one episode are serialized; episodes run
concurrently), plans the prompt (``turngym.proxy.segments``), samples, parses the replies, and
commits the record only when all of that succeeded: a refused or failed call leaves the episode as
it was. ``chat``/``complete`` return a ``CallResult`` that ``turngym.proxy.responses`` turns into
OpenAI response objects.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from turngym.agents.backend import BackendError
from turngym.core.types import Message
from turngym.proxy.episodes import CallRecord, Episode, EpisodeStore
from turngym.proxy.model import ProxyModel, Reply, Sample
from turngym.proxy.segments import Candidate, Plan, plan_chat, plan_text
from turngym.proxy.wire import CallRequest, ChatRequest, ProxyError, TextRequest


@dataclass
class CallResult:
    """What a call produced: the samples, the replies (chat) and the usage numbers."""

    id: str  # the responses prefix it (chatcmpl-, cmpl-)
    created: int
    model: str
    episode: str
    samples: list[Sample]
    replies: list[Reply] = field(default_factory=list)
    prompt_tokens: int = 0

    @property
    def completion_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.samples)


class Proxy:
    """The model, the episodes, and the calls between them."""

    def __init__(self, model: ProxyModel, store: EpisodeStore):
        self.model = model
        self.store = store
        store.on_finish.append(self._release)

    def _release(self, ep: Episode) -> None:
        release = getattr(self.model.backend, "release", None)
        if release is not None:
            for route in ep.routes:
                release(route)

    async def chat(self, key: str, req: ChatRequest) -> CallResult:
        self.model.check_model(req.model)
        fmt = self.model.chat_format(req.tools)
        ep = self.store.open(key)
        t0 = time.monotonic()
        async with ep.lock:
            ep = self.store.open(key)  # it may have finished while this call waited
            queued = time.monotonic() - t0
            plan = plan_chat(fmt, req.messages, ep.current, ep.current_fmt)
            samples = await self._sample(ep, plan, fmt, req)
            replies = [self.model.reply(s.text, req.tools, req.tool_choice) for s in samples]
            candidates = []
            for i, (s, r) in enumerate(zip(samples, replies, strict=True)):
                tokens = plan.tokens if i == len(samples) - 1 else plan.tokens.copy()
                span = tokens.add_generation(s.token_ids, s.logprobs)
                candidates.append(Candidate(tokens, r.message, s.text, span))
            result = self._record(ep, plan, candidates, samples, fmt, t0, queued, replies[0].error)
            result.replies = replies
            ep.known = req.known
            return result

    async def complete(self, key: str, req: TextRequest) -> CallResult:
        self.model.check_model(req.model)
        fmt = self.model.text_format
        ep = self.store.open(key)
        t0 = time.monotonic()
        async with ep.lock:
            ep = self.store.open(key)
            queued = time.monotonic() - t0
            plan = plan_text(fmt, req.prompt, ep.current)
            samples = await self._sample(ep, plan, fmt, req)
            candidates = []
            for i, s in enumerate(samples):
                tokens = plan.tokens if i == len(samples) - 1 else plan.tokens.copy()
                span = tokens.add_generation(s.token_ids, s.logprobs, s.text)
                candidates.append(Candidate(tokens, _text_action(s.text), s.text, span))
            return self._record(ep, plan, candidates, samples, fmt, t0, queued, "")

    async def _sample(self, ep: Episode, plan: Plan, fmt: object, req: CallRequest) -> list[Sample]:
        route = f"{ep.key}/{ep.segments if not plan.continued else max(ep.segments - 1, 0)}"
        ep.routes.update([route, *(f"{route}#{i}" for i in range(1, req.n))])
        try:
            return await self.model.sample(fmt, plan.tokens.token_ids.tolist(), req, route)  # type: ignore[arg-type]
        except BackendError as e:
            raise ProxyError(503, f"the backend failed: {e}", code="backend_error") from e

    def _record(
        self,
        ep: Episode,
        plan: Plan,
        candidates: list[Candidate],
        samples: list[Sample],
        fmt: object,
        t0: float,
        queued: float,
        error: str,
    ) -> CallResult:
        now = time.monotonic()
        prev = ep.last_call if ep.calls else ep.created
        first = samples[0]
        timing = {
            "queued": queued,
            "generate": now - t0 - queued,
            "harness": max(t0 - prev, 0.0) if ep.calls else 0.0,
            **{f"generate/{k}": v for k, v in first.timing.items()},
        }
        record = CallRecord(
            index=len(ep.calls),
            segment=0,
            action=candidates[0].action,
            gen_span=candidates[0].gen_span,
            prompt_tokens=candidates[0].gen_span[0],
            completion_tokens=len(first.token_ids),
            finish_reason=first.finish_reason,
            n=len(samples),
            error=error,
            drift=plan.drift,
            timing=timing,
            started=t0,
        )
        ep.commit(plan, candidates, record, fmt)
        return CallResult(
            id=uuid.uuid4().hex[:24],
            created=int(time.time()),
            model=self.model.name,
            episode=ep.key,
            samples=samples,
            prompt_tokens=record.prompt_tokens,
        )


def _text_action(text: str) -> Message:
    return Message(role="assistant", content=text)
