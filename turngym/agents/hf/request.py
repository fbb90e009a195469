"""A request inside an HF engine, from admission to its answer, and the small helpers every part of
the engine shares: the common prefix of two id lists, errors as ``BackendError``, answering once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from turngym.agents.backend import BackendError, Generation, SamplingParams


@dataclass(eq=False)
class Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    done: Callable[[Generation | BaseException], None]
    gave_up: Callable[[], bool] = lambda: False
    seed: int = 0
    stops: frozenset[int] = frozenset()
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    route: str | None = None
    submitted: float = 0.0  # perf_counter when the caller asked
    admitted: float = 0.0  # start of the pass that prefilled it
    first_token: float = 0.0  # when that pass sampled its first token
    generator: Any = None  # made at admission, for sampled (non-greedy) requests only
    reuse: int = 0  # leading prompt tokens whose KV came from the route's parked row
    parked: float | None = None  # when the finished row was parked (its KV kept for the route's next turn)
    epoch: int = 0  # the prefix-cache epoch it was parked in

    @property
    def finished(self) -> bool:
        return len(self.tokens) >= self.sampling.max_tokens or (
            bool(self.tokens) and self.tokens[-1] in self.stops
        )

    @property
    def cached_ids(self) -> list[int]:
        """The ids whose KV a finished row holds: the prompt and every sampled token but the last."""
        return self.prompt_ids + self.tokens[:-1]

    @property
    def filtered(self) -> bool:
        """Whether it samples with top-k or top-p."""
        return self.sampling.top_k > 0 or self.sampling.top_p < 1


def result(r: Request, tokenizer: Any) -> Generation:
    """The answer to a finished request, with the rollout ledger's parts of the caller's wait."""
    reason = "stop" if r.tokens[-1] in r.stops else "length"
    return Generation(
        token_ids=r.tokens,
        logprobs=r.logprobs,
        finish_reason=reason,
        text=tokenizer.decode(r.tokens, skip_special_tokens=True),
        prompt_len=len(r.prompt_ids),
        meta={
            "weights_version": [r.versions[0], r.versions[-1]],
            "timing": {  # the rollout ledger's parts of the caller's wait (turngym.rollout.ledger)
                "queued": max(r.admitted - r.submitted, 0.0),
                "prefill": max(r.first_token - r.admitted, 0.0),
                "decode": max(time.perf_counter() - r.first_token, 0.0),
            },
        },
    )


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading ids two sequences share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def once(done: Callable[[Generation | BaseException], None]) -> Callable[[Generation | BaseException], None]:
    """``done`` called at most once: a request failed with its batch after it was answered keeps its answer."""
    called = False

    def reply(res: Generation | BaseException) -> None:
        nonlocal called
        if not called:
            called = True
            done(res)

    return reply


def release_cuda_cache() -> None:
    """After an error (often CUDA out of memory) the dropped batch's cache blocks go back to the card."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def backend_error(e: BaseException) -> BackendError:
    return e if isinstance(e, BackendError) else BackendError(f"{type(e).__name__}: {e}")


def settle(fut: asyncio.Future, res: Generation | BaseException) -> None:
    """Resolve a caller's future with a generation or an error, unless it is already done."""
    if fut.done():
        return
    if isinstance(res, BaseException):
        fut.set_exception(res)
    else:
        fut.set_result(res)
