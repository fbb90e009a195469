"""The token-level inference backend protocol.

Every trainable backend (``VLLMBackend``, ``HFBackend``) implements::

    gen = await backend.generate(prompt_ids, SamplingParams(max_tokens=128, temperature=1.0),
                                 route="traj-17", adapter="policy-step-3")
    gen.token_ids      # the sampled ids, exactly as sampled (a stop token that ended the
                       # generation is included as the last id)
    gen.logprobs       # one float per sampled id: log p(token | context) under the model's raw
                       # distribution (temperature 1, no top-k/top-p), as vLLM reports by default
    gen.finish_reason  # "stop" (a stop token) or "length" (max_tokens)
    gen.text           # the decoded text without special tokens

Backends batch concurrent ``generate`` calls themselves: callers just issue many coroutines.
``route`` groups the requests of one trajectory (a multi-server backend sends them to the same
server for prefix-cache reuse); ``adapter`` names a LoRA adapter where the backend supports them.
Failures raise ``BackendError`` (the rollout engine turns it into a masked trajectory).
The backends of this package derive from ``TokenBackend``, which checks each request before it reaches
their ``_generate``; any object with these two coroutines is a ``Backend``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


class BackendError(RuntimeError):
    """A backend could not produce a generation (server down, bad response, out of memory...)."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one generation. ``temperature=0`` means greedy."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def replace(self, **changes) -> SamplingParams:
        from dataclasses import replace

        return replace(self, **changes)


@dataclass
class Generation:
    """One generation: sampled ids, their logprobs, why it stopped, and its text."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str = ""
    prompt_len: int = 0
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.logprobs) != len(self.token_ids):
            raise BackendError(
                f"backend returned {len(self.token_ids)} token ids but {len(self.logprobs)} logprobs"
            )


@runtime_checkable
class Backend(Protocol):
    """What the rollout engine needs from a token-level backend."""

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        *,
        route: str | None = None,
        adapter: str | None = None,
    ) -> Generation: ...

    async def aclose(self) -> None: ...


class TokenBackend:
    """Base of this package's backends: ``generate`` refuses an empty prompt (and an ``adapter``
    where ``no_adapters`` says why the backend serves none), then hands the request to ``_generate``."""

    #: why an ``adapter`` is refused; None: the backend serves LoRA adapters
    no_adapters: str | None = None

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        *,
        route: str | None = None,
        adapter: str | None = None,
    ) -> Generation:
        if adapter is not None and self.no_adapters:
            raise BackendError(self.no_adapters)
        if not prompt_ids:
            raise BackendError("empty prompt")
        return await self._generate(prompt_ids, sampling, route, adapter)

    async def _generate(
        self, prompt_ids: list[int], sampling: SamplingParams, route: str | None, adapter: str | None
    ) -> Generation:
        raise NotImplementedError
