"""Sampling in the HF engines: per-request settings (temperature, top-k, top-p, seed) mixed freely
in one batch, greedy rows taking the argmax, and the raw model logprob of each sampled token
(temperature 1, before top-k/top-p).

* ``RowSampler`` (continuous engine): each request samples from its own ``torch.Generator``, one
  exponential race per token, so a seed gives the same sample whatever else is in the batch.
* ``pick`` (slots engine): the inverse CDF at a uniform draw that is a hash of (request seed, token
  index) computed on the device (``seeded_uniforms``, bit for bit the host's ``seeded_uniform``): no
  per-request RNG state and no host sync, so a CUDA graph can hold it.
"""

from __future__ import annotations

import time
from typing import Any

from turngym.agents.backend import SamplingParams
from turngym.agents.hf.request import Request


class RowSampler:
    """The continuous engine's sampler: one token per active row with the row's own settings and
    generator (on ``device``)."""

    def __init__(self, device: Any):
        self.device = device

    def sample(self, rows: list[Request], logits: Any, version: int) -> Any:
        """Sample one token per active row with the row's own settings and generator; record raw
        logprobs. Parked rows' entries are left unused."""
        import torch

        with torch.inference_mode():
            logits = logits.float()
            raw = torch.log_softmax(logits, dim=-1)
            tokens = raw.argmax(dim=-1)
            hot = [i for i, r in enumerate(rows) if r.parked is None and not r.sampling.greedy]
            if hot:
                idx = torch.tensor(hot, device=logits.device)
                probs = filtered_probs(logits[idx], [rows[i].sampling for i in hot])
                race = torch.empty_like(probs)
                for j, i in enumerate(hot):
                    race[j].exponential_(generator=self.generator(rows[i]))
                tokens[idx] = (probs / race).argmax(dim=-1)
            lps = raw.gather(1, tokens[:, None]).squeeze(1)
            now = time.perf_counter()
            for r, t, lp in zip(rows, tokens.tolist(), lps.tolist(), strict=True):
                if r.parked is None:
                    if not r.tokens:
                        r.first_token = now
                    r.tokens.append(t)
                    r.logprobs.append(lp)
                    r.versions.append(version)
        return tokens

    def generator(self, r: Request) -> Any:
        """The request's own RNG, seeded on first use."""
        if r.generator is None:
            import torch

            r.generator = torch.Generator(device=self.device)
            r.generator.manual_seed(r.seed)
        return r.generator


def filtered_probs(logits: Any, samplings: list[SamplingParams]) -> Any:
    """Row-wise temperature, then top-k, then top-p (nucleus), as probabilities."""
    import torch

    dev = logits.device
    temps = torch.tensor([s.temperature for s in samplings], device=dev, dtype=logits.dtype)
    scaled = logits / temps[:, None]
    if all(s.top_k <= 0 and s.top_p >= 1 for s in samplings):
        return torch.softmax(scaled, dim=-1)
    vocab = logits.shape[-1]
    top_k = torch.tensor([s.top_k if s.top_k > 0 else vocab for s in samplings], device=dev).clamp(max=vocab)
    top_p = torch.tensor([s.top_p for s in samplings], device=dev, dtype=logits.dtype)
    ordered, order = scaled.sort(dim=-1, descending=True)
    drop = torch.arange(vocab, device=dev)[None, :] >= top_k[:, None]
    ordered = ordered.masked_fill(drop, float("-inf"))
    probs = torch.softmax(ordered, dim=-1)
    drop = (probs.cumsum(dim=-1) - probs) > top_p[:, None]  # the top token always stays
    ordered = ordered.masked_fill(drop, float("-inf"))
    filtered = torch.full_like(scaled, float("-inf")).scatter(-1, order, ordered)
    return torch.softmax(filtered, dim=-1)


_M1, _M2, LOW32 = 0x7FEB352D, 0x846CA68B, 0xFFFFFFFF


def _mix32(x: int) -> int:
    """A 32-bit integer hash (lowbias32)."""
    x ^= x >> 16
    x = (x * _M1) & LOW32
    x ^= x >> 15
    x = (x * _M2) & LOW32
    return x ^ (x >> 16)


def seeded_uniform(seed: int, index: int) -> float:
    """A uniform draw in (0, 1), a pure function of a request's seed and the index of the token it
    samples: the same seed gives the same draws whatever else is in the batch."""
    lo, hi = seed & LOW32, (seed >> 32) & LOW32
    x = _mix32(_mix32(lo ^ _mix32(hi ^ 0x9E3779B9)) ^ _mix32((index + 0x632BE5AB) & LOW32))
    return ((x >> 8) + 0.5) / (1 << 24)


def _mul32(x: Any, m: int) -> Any:
    """``(x * m) mod 2^32`` for int64 tensors ``x`` < 2^32 without overflowing int64: the product in
    two 16-bit halves of ``x``."""
    return (((x & 0xFFFF) * m) + ((((x >> 16) * m) & 0xFFFF) << 16)) & LOW32


def _mix32_t(x: Any) -> Any:
    """``_mix32`` on an int64 tensor of 32-bit values."""
    x = x ^ (x >> 16)
    x = _mul32(x, _M1)
    x = x ^ (x >> 15)
    x = _mul32(x, _M2)
    return x ^ (x >> 16)


def seeded_uniforms(lo: Any, hi: Any, index: Any) -> Any:
    """``seeded_uniform`` on tensors, on the device and inside a graph: ``lo``/``hi`` the seeds'
    low and high 32 bits, ``index`` the token indices (broadcast); float32 draws, bit for bit
    ``seeded_uniform``'s."""
    x = _mix32_t(_mix32_t(lo ^ _mix32_t(hi ^ 0x9E3779B9)) ^ _mix32_t((index + 0x632BE5AB) & LOW32))
    return (((x >> 8).double() + 0.5) / (1 << 24)).float()


def pick(
    logits: Any, temp: Any, greedy: Any, top_k: Any, top_p: Any, u: Any, filtered: bool
) -> tuple[Any, Any]:
    """One token per row of ``logits`` ``[rows, vocab]`` (float) and its raw logprob: greedy rows
    the argmax; the others by inverse CDF at their uniform draw ``u`` over the tempered (and, when
    ``filtered``, top-k/top-p filtered) distribution. Per-row settings are tensors; no host sync, so
    a CUDA graph can hold it."""
    import torch

    best = logits.argmax(dim=-1)
    z = logits / temp[:, None]
    if filtered:
        vocab = z.shape[-1]
        k = torch.where(top_k > 0, top_k, vocab).clamp(max=vocab)
        ordered, order = z.sort(dim=-1, descending=True)
        ranks = torch.arange(vocab, device=z.device)
        ordered = ordered.masked_fill(ranks[None, :] >= k[:, None], float("-inf"))
        probs = torch.softmax(ordered, dim=-1)
        ordered = ordered.masked_fill((probs.cumsum(dim=-1) - probs) > top_p[:, None], float("-inf"))
        z = torch.full_like(z, float("-inf")).scatter(-1, order, ordered)  # the top token always stays
    cdf = torch.exp(z - z.max(dim=-1, keepdim=True).values).cumsum(dim=-1)
    drawn = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0].clamp(max=z.shape[-1] - 1)
    tok = torch.where(greedy, best, drawn)
    lp = logits.gather(1, tok[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)
    return tok, lp
