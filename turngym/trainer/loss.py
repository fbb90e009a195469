"""Policy-gradient losses over token tensors ``[batch, seq]`` with a loss mask.

PPO clipped surrogate with separate low/high clip, optional dual clip, the importance ratio
against the sampling logprobs, KL to a reference policy (k1/k3) and an entropy bonus; three
aggregations. For gradient accumulation pass the whole batch's token/sequence counts as
``num_tokens``/``num_seqs`` so the micro-batch losses add up to the full-batch loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

Aggregation = Literal["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"]
KLType = Literal["k1", "k3"]


@dataclass(frozen=True)
class LossConfig:
    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float | None = None  # c > 1: caps the loss of negative-advantage tokens at -c·A
    kl_coef: float = 0.0
    kl_type: KLType = "k3"
    entropy_coef: float = 0.0
    aggregation: Aggregation = "token_mean"


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: KLType = "k3") -> torch.Tensor:
    """Per-token KL(π || π_ref) estimate: k1 = log π - log π_ref; k3 = exp(-k1) + k1 - 1 (>= 0)."""
    log_ratio = logprobs - ref_logprobs
    if kind == "k1":
        return log_ratio
    if kind == "k3":
        return torch.exp(-log_ratio) + log_ratio - 1.0
    raise ValueError(f"unknown KL estimator {kind!r}")


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: Aggregation = "token_mean",
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> torch.Tensor:
    """Reduce per-token ``values`` over the ``mask``; an all-zero mask gives 0 (never NaN).

    ``token_mean``: Σ values / #tokens; ``seq_mean_token_sum``: mean over sequences of the token sum;
    ``seq_mean_token_mean``: mean over sequences of the token mean. Sequences without a masked-in
    token do not count. ``num_tokens``/``num_seqs`` override the denominators (whole-batch counts).
    """
    mask = mask.to(values.dtype)
    masked = values * mask
    if mode == "token_mean":
        if num_tokens is not None:
            return masked.sum() / max(float(num_tokens), 1.0)
        return masked.sum() / mask.sum().clamp(min=1.0)
    per_seq_tokens = mask.sum(dim=-1)
    live = (per_seq_tokens > 0).to(values.dtype)
    seqs = num_seqs if num_seqs is not None else live.sum().clamp(min=1.0)
    if mode == "seq_mean_token_sum":
        return masked.sum(dim=-1).sum() / seqs
    if mode == "seq_mean_token_mean":
        return (masked.sum(dim=-1) / per_seq_tokens.clamp(min=1.0)).sum() / seqs
    raise ValueError(f"unknown aggregation {mode!r}")


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: LossConfig = LossConfig(),
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The PPO-clip loss (to minimise) and its diagnostics.

    ratio = exp(logprobs - old_logprobs); per token
    ``pg = -min(ratio·A, clip(ratio, 1-clip_low, 1+clip_high)·A)``, and with ``dual_clip = c``
    ``pg = min(pg, -c·A)`` where A < 0. Then ``+ kl_coef·KL(π||π_ref) - entropy_coef·H``.
    """
    mask = mask.to(logprobs.dtype)
    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    surr = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - config.clip_low, 1.0 + config.clip_high) * advantages
    pg = -torch.minimum(surr, clipped)
    clip_frac = (surr > clipped).to(logprobs.dtype)
    if config.dual_clip is not None:
        if config.dual_clip <= 1.0:
            raise ValueError("dual_clip must be > 1")
        capped = torch.minimum(pg, -config.dual_clip * advantages)
        pg = torch.where(advantages < 0, capped, pg)
    per_token = pg
    stats: dict[str, torch.Tensor] = {
        "pg_loss": aggregate(pg, mask, config.aggregation, num_tokens, num_seqs)
    }
    if config.kl_coef and ref_logprobs is not None:
        kl = kl_penalty(logprobs, ref_logprobs, config.kl_type)
        per_token = per_token + config.kl_coef * kl
        stats["kl"] = aggregate(kl, mask, "token_mean")
    if config.entropy_coef and entropy is not None:
        per_token = per_token - config.entropy_coef * entropy
    if entropy is not None:
        stats["entropy"] = aggregate(entropy, mask, "token_mean")
    loss = aggregate(per_token, mask, config.aggregation, num_tokens, num_seqs)
    with torch.no_grad():
        stats["clip_frac"] = aggregate(clip_frac, mask, "token_mean")
        stats["ratio_mean"] = aggregate(ratio, mask, "token_mean")
        stats["approx_kl_old"] = aggregate(0.5 * log_ratio**2, mask, "token_mean")
    return loss, {k: float(v.detach()) for k, v in stats.items()}


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-position entropy of the categorical distribution given by ``logits`` (last dim)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)
