"""``LLMAgent``: a token-level policy over a ``Backend``, with exact token bookkeeping.

    agent = LLMAgent(backend, tokenizer, SamplingParams(max_tokens=128), max_context=1024)

Each session renders the first observation with the tokenizer's chat template, asks the backend
for a generation, returns the decoded text as the action, and appends the template delta of each
observation (see ``turngym.agents.chat``). Sampling seeds are derived from the trajectory seed so
a rollout is reproducible on backends that honour per-request seeds (vLLM).
"""

from __future__ import annotations

from typing import Any

from turngym.agents.backend import Backend, SamplingParams
from turngym.agents.base import AgentStep, ContextFull
from turngym.agents.chat import ChatFormat, ChatTokens
from turngym.core.types import Message, Trajectory


class LLMAgent:
    """A trainable agent: chat template + backend + sampling parameters."""

    name = "llm"

    def __init__(
        self,
        backend: Backend,
        tokenizer: Any,
        sampling: SamplingParams | None = None,
        *,
        max_context: int = 4096,
        native_tools: bool = False,
        adapter: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ):
        self.backend = backend
        self.tokenizer = tokenizer
        self.sampling = sampling or SamplingParams()
        self.max_context = max_context
        self.native_tools = native_tools
        self.adapter = adapter
        self.template_kwargs = template_kwargs
        self._formats: dict[tuple[str, ...], ChatFormat] = {}
        base = ChatFormat(tokenizer, template_kwargs=template_kwargs)
        if not self.sampling.stop_token_ids:
            self.sampling = self.sampling.replace(stop_token_ids=tuple(sorted(base.stop_token_ids)))
        self._formats[()] = base

    def chat_format(self, env: Any) -> ChatFormat:
        """The format for ``env``: with its tools rendered natively if ``native_tools``."""
        if not self.native_tools:
            return self._formats[()]
        if getattr(env, "tools_in_prompt", False):
            raise ValueError(
                "native_tools=True needs an env made with tools_in_prompt=False "
                "(otherwise the model sees the tools twice)"
            )
        tools = [t.to_openai() for t in env.tools]
        key = tuple(sorted(t["function"]["name"] for t in tools))
        if key not in self._formats:
            self._formats[key] = ChatFormat(self.tokenizer, tools=tools, template_kwargs=self.template_kwargs)
        return self._formats[key]

    def start(self, env: Any, prompt: list[Message], *, seed: int | None, route: str) -> LLMSession:
        return LLMSession(self, ChatTokens(self.chat_format(env), prompt), seed=seed, route=route)


class LLMSession:
    def __init__(self, agent: LLMAgent, tokens: ChatTokens, *, seed: int | None, route: str):
        self.agent = agent
        self.tokens = tokens
        self.seed = seed
        self.route = route
        self.turn = 0
        self.generated = 0

    async def act(self) -> AgentStep:
        room = self.agent.max_context - len(self.tokens)
        if room < 1:
            raise ContextFull(f"{len(self.tokens)} tokens fill the context of {self.agent.max_context}")
        sampling = self.agent.sampling
        changes: dict[str, Any] = {"max_tokens": min(sampling.max_tokens, room)}
        if self.seed is not None:
            changes["seed"] = (self.seed * 1_000_003 + self.turn) % (2**31)
        gen = await self.agent.backend.generate(
            self.tokens.token_ids.tolist(),
            sampling.replace(**changes),
            route=self.route,
            adapter=self.agent.adapter,
        )
        span = self.tokens.add_generation(gen.token_ids, gen.logprobs)
        self.turn += 1
        self.generated += len(gen.token_ids)
        text = self.tokens.fmt.decode(gen.token_ids)
        timing = {k: float(v) for k, v in (gen.meta.get("timing") or {}).items()}
        return AgentStep(Message(role="assistant", content=text), gen.finish_reason, span, timing=timing)

    def observe(self, action: Message, observation: list[Message]) -> tuple[int, int]:
        return self.tokens.add_observation(action, observation)

    def fork(self, env: Any, *, seed: int | None, route: str) -> LLMSession:
        """A new session with the same tokens so far (copied, not shared) that samples with its own
        seed and route: a branch of a tree rollout. ``env`` is unused (the tokens are the state)."""
        child = LLMSession(self.agent, self.tokens.copy(), seed=seed, route=route)
        child.turn, child.generated = self.turn, self.generated
        share = getattr(self.agent.backend, "share_prefix", None)  # HFBackend: copy the KV, not prefill
        if share is not None and route != self.route:
            share(self.route, route)
        return child

    def sampled_logprobs(self, span: tuple[int, int]) -> list[float]:
        """The logprobs of the ids sampled in ``span`` (a turn's ``gen_span``)."""
        return self.tokens.logprobs[span[0] : span[1]].tolist()

    def end(self) -> None:
        """The trajectory is over: a backend that keeps a trajectory's KV cache (``HFBackend``)
        frees it now instead of when it expires."""
        release = getattr(self.agent.backend, "release", None)
        if release is not None:
            release(self.route)

    def export(self, trajectory: Trajectory) -> None:
        t = self.tokens
        trajectory.token_ids = t.token_ids.tolist()
        trajectory.loss_mask = t.loss_mask.tolist()
        trajectory.logprobs = t.logprobs.tolist()
        trajectory.prompt_len = t.prompt_len
        trajectory.metrics["generated_tokens"] = float(self.generated)
        trajectory.metrics["retokenization_drift"] = float(t.retokenization_drift)
