"""``HFBackend``: transformers in-process (CPU or GPU) with dynamic batching of concurrent requests.

    backend = HFBackend("tiny", max_batch_size=64, max_wait_ms=5)
    gen = await backend.generate(prompt_ids, SamplingParams(max_tokens=64, temperature=0))

Concurrent ``generate`` calls are queued; a worker collects up to ``max_batch_size`` requests or
waits at most ``max_wait_ms`` after the first, groups them by sampling settings (temperature, top-p,
top-k, stop ids), left-pads each group, runs ``model.generate`` in a worker thread (the event loop
stays free for env steps), and cuts each result at its own stop token or ``max_tokens``.
Logprobs are the raw model log-probabilities of the sampled tokens (temperature 1, before top-k/p),
captured during generation. Under greedy decoding a batched request gives the same ids as the same
request alone (tested). Per-request ``seed`` is not honoured (batches share torch's RNG).

For the trainer: ``backend.model`` is the live model; ``update_weights(state_dict)`` swaps weights
between batches (a lock keeps generation and updates apart); ``generate_batch`` is the synchronous
batched call used by the worker and benchmarks.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turngym.agents.backend import BackendError, Generation, SamplingParams


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    future: asyncio.Future


class HFBackend:
    def __init__(
        self,
        model: str | Path | Any,
        tokenizer: Any = None,
        *,
        device: str | None = None,
        dtype: Any = None,
        max_batch_size: int = 32,
        max_wait_ms: float = 5.0,
        attn_implementation: str | None = None,
    ):
        from turngym.agents.models import load_model, load_tokenizer

        if isinstance(model, (str, Path)):
            self.tokenizer = tokenizer or load_tokenizer(model)
            self.model = load_model(
                model, device=device, dtype=dtype, attn_implementation=attn_implementation
            )
        else:
            if tokenizer is None:
                raise ValueError("pass the tokenizer along with a model object")
            self.model, self.tokenizer = model, tokenizer
        self.device = next(self.model.parameters()).device
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.tokenizer.eos_token_id
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_ms / 1000
        self._queue: asyncio.Queue[_Request] | None = None
        self._worker: asyncio.Task | None = None
        self._lock = threading.Lock()
        self.batches = 0  # counters for tests and benchmarks
        self.batch_sizes: list[int] = []

    # ------------------------------------------------------------- async API
    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        *,
        route: str | None = None,
        adapter: str | None = None,
    ) -> Generation:
        if adapter is not None:
            raise BackendError(
                "HFBackend serves one set of weights; use update_weights() instead of adapters"
            )
        if not prompt_ids:
            raise BackendError("empty prompt")
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done() or self._worker.get_loop() is not loop:
            self._queue = asyncio.Queue()
            self._worker = loop.create_task(self._run_worker(self._queue))
        fut = loop.create_future()
        assert self._queue is not None
        await self._queue.put(_Request(list(prompt_ids), sampling, fut))
        return await fut

    async def aclose(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
            self._worker = None

    async def _run_worker(self, queue: asyncio.Queue[_Request]) -> None:
        while True:
            batch = [await queue.get()]
            deadline = time.monotonic() + self.max_wait_s
            while len(batch) < self.max_batch_size:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    while len(batch) < self.max_batch_size and not queue.empty():
                        batch.append(queue.get_nowait())
                    break
                try:
                    batch.append(await asyncio.wait_for(queue.get(), remaining))
                except TimeoutError:
                    break
            batch = [r for r in batch if not r.future.done()]  # callers that gave up
            groups: dict[tuple, list[_Request]] = {}
            for r in batch:
                s = r.sampling
                groups.setdefault((s.temperature, s.top_p, s.top_k, s.stop_token_ids), []).append(r)
            for reqs in groups.values():
                try:
                    gens = await asyncio.to_thread(
                        self.generate_batch, [r.prompt_ids for r in reqs], [r.sampling for r in reqs]
                    )
                except Exception as e:  # noqa: BLE001 - every waiting caller gets the error
                    err = e if isinstance(e, BackendError) else BackendError(f"{type(e).__name__}: {e}")
                    for r in reqs:
                        if not r.future.done():
                            r.future.set_exception(err)
                    continue
                for r, g in zip(reqs, gens, strict=True):
                    if not r.future.done():
                        r.future.set_result(g)

    # -------------------------------------------------------------- sync API
    def generate_batch(self, prompts: list[list[int]], samplings: list[SamplingParams]) -> list[Generation]:
        """Generate for several prompts at once (they must share temperature/top-p/top-k/stop ids)."""
        import torch
        from transformers import GenerationConfig, LogitsProcessorList

        s0 = samplings[0]
        stops = set(s0.stop_token_ids) or {self.tokenizer.eos_token_id}
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p) :] = 1
        config = GenerationConfig(
            max_new_tokens=max(s.max_tokens for s in samplings),
            do_sample=not s0.greedy,
            temperature=s0.temperature if not s0.greedy else None,
            top_p=s0.top_p if not s0.greedy else None,
            top_k=(s0.top_k if s0.top_k > 0 else None) if not s0.greedy else None,
            eos_token_id=sorted(stops),
            pad_token_id=self.pad_id,
        )
        recorder = _RawLogprobs()
        with self._lock, torch.inference_mode():
            out = self.model.generate(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                generation_config=config,
                logits_processor=LogitsProcessorList([recorder]),
            )
            new = out[:, width:]
            logprobs = recorder.finish(new)
        self.batches += 1
        self.batch_sizes.append(len(prompts))
        new_l, lp_l = new.tolist(), logprobs.tolist()
        gens = []
        for i, (p, s) in enumerate(zip(prompts, samplings, strict=True)):
            toks, lps = new_l[i], lp_l[i]
            end, reason = min(s.max_tokens, len(toks)), "length"
            for j, t in enumerate(toks[:end]):
                if t in stops:
                    end, reason = j + 1, "stop"
                    break
            gens.append(
                Generation(
                    token_ids=toks[:end],
                    logprobs=lps[:end],
                    finish_reason=reason,
                    text=self.tokenizer.decode(toks[:end], skip_special_tokens=True),
                    prompt_len=len(p),
                )
            )
        return gens

    def update_weights(self, state_dict: dict[str, Any], strict: bool = True) -> None:
        """Load new weights into the live model, between generation batches."""
        with self._lock:
            self.model.load_state_dict(state_dict, strict=strict)


class _RawLogprobs:
    """A logits processor that records log p(sampled token) under the raw logits.

    Custom processors run before temperature/top-k/top-p, so ``scores`` here are the model's raw
    logits. At step t it sees the token sampled at step t-1 as ``input_ids[:, -1]``.
    """

    def __init__(self) -> None:
        self.prev = None
        self.steps: list[Any] = []

    def __call__(self, input_ids, scores):
        import torch

        if self.prev is not None:
            self.steps.append(self.prev.gather(1, input_ids[:, -1:]).squeeze(1))
        self.prev = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, new_tokens):
        import torch

        n = new_tokens.shape[1]
        if self.prev is not None and len(self.steps) < n:
            self.steps.append(
                self.prev.gather(1, new_tokens[:, len(self.steps) : len(self.steps) + 1]).squeeze(1)
            )
        if not self.steps:
            return torch.zeros_like(new_tokens, dtype=torch.float32)
        return torch.stack(self.steps[:n], dim=1).cpu()
