"""The update role of the trainer: one policy-gradient update from a step's trajectories and their
per-token advantages — micro-batches by token budget, gradient accumulation, the loss, clipping, the
optimizer and schedule steps, and the update's metrics.

Under data parallelism each rank's loss is its share of the global-batch loss (the denominators are
summed over ranks first) and gradients are all-reduced once per optimizer step, so the update equals
one process's on the whole batch (:mod:`turngym.trainer.distributed`). Under FSDP every rank runs
as many passes as the busiest one (each pass all-gathers every layer): the others add zero-weight
passes, and gradients are reduce-scattered on the last pass only, or on every pass with
``cluster.fsdp.reduce_every_micro_batch`` (:mod:`turngym.trainer.fsdp`). An out-of-memory error
names the settings to turn (:mod:`turngym.trainer.oom`).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from turngym.core.types import Trajectory
from turngym.trainer.config import TrainConfig
from turngym.trainer.distributed import merge_metrics, sync_context, zero_backward
from turngym.trainer.fsdp import gradient_sync as fsdp_gradient_sync
from turngym.trainer.oom import explain_oom, update_knobs

if TYPE_CHECKING:
    from turngym.trainer.policy import Policy


def policy_update(
    policy: Policy, cfg: TrainConfig, trajs: list[Trajectory], token_adv: list[np.ndarray]
) -> dict[str, float]:
    """Train ``policy`` on the unmasked trajectories with a loss mask (``ppo_epochs`` optimizer steps);
    returns ``update/...`` metrics (``update/skipped`` when no rank has anything to train on)."""
    import torch

    from turngym.trainer.batching import micro_batches, pad_right, train_mode_without_dropout
    from turngym.trainer.loss import LossConfig

    dist = policy.dist
    keep = [k for k, t in enumerate(trajs) if not t.masked and t.token_ids and any(t.loss_mask)]
    seqs, advs = segment_sequences([trajs[k] for k in keep], [token_adv[k] for k in keep])
    # denominators of the global batch (all ranks): each rank's loss is its share of the batch loss
    num_tokens, num_seqs = dist.all_sum([sum(sum(t.loss_mask) for t in seqs), len(seqs)])
    if not num_seqs:
        return {"update/skipped": 1.0}
    loss_cfg = LossConfig(**cfg.loss.model_dump())
    policy.release_full_weights()  # cluster.fsdp.release_full_copy: the refresh after the update rebuilds it
    groups = micro_batches([len(t.token_ids) for t in seqs], cfg.optim.micro_batch_tokens)
    stats: dict[str, list[float]] = {}
    grad_norms = []
    dev = policy.device
    # FSDP: the same number of passes on every rank; DDP: only the gradient all-reduce is collective
    passes = int(max(dist.all_gather(len(groups)))) if policy.sharded else max(len(groups), 1)
    sync = fsdp_gradient_sync if policy.sharded else sync_context
    every = policy.sharded and cfg.cluster.fsdp.reduce_every_micro_batch  # no whole-model gradient kept
    with train_mode_without_dropout(policy.model):  # train mode, or gradient checkpointing is off
        for _ in range(cfg.optim.ppo_epochs):
            policy.optimizer.zero_grad(set_to_none=True)
            for g, group in enumerate(groups):
                batch = [seqs[k] for k in group]
                tensors = (
                    pad_right([t.token_ids for t in batch], 0, torch.long, dev),
                    pad_right([[1] * len(t.token_ids) for t in batch], 0, torch.long, dev),
                    pad_right([t.loss_mask for t in batch], 0, torch.float32, dev),
                    pad_right([t.logprobs for t in batch], 0.0, torch.float32, dev),
                    pad_right([advs[k] for k in group], 0.0, torch.float32, dev),
                )
                # gradients are all-reduced (DDP) or reduce-scattered (FSDP) in the last pass only
                # (FSDP with cluster.fsdp.reduce_every_micro_batch: in every pass)
                knobs = partial(update_knobs, cfg, policy.sharded, tensors[0].numel())
                with sync(policy.wrapped, last=every or g == passes - 1), explain_oom("update", knobs, dev):
                    loss, s = _micro_batch_loss(policy, cfg, loss_cfg, tensors, num_tokens, num_seqs)
                    (loss * dist.loss_scale).backward()
                # pg_loss and loss are this micro-batch's share of the batch loss; the rest are token
                # means of the micro-batch, weighted by its share of the batch's tokens
                weight = float(tensors[2].sum()) / num_tokens
                for k, v in s.items():
                    stats.setdefault(k, []).append(v if k == "pg_loss" else v * weight)
                stats.setdefault("loss", []).append(float(loss.detach()))
            for g in range(len(groups), passes):  # nothing left here, but this rank joins the collectives
                with sync(policy.wrapped, last=every or g == passes - 1):
                    if policy.sharded:  # the same forwards as a real pass (the LoRA reference's too)
                        empty = _empty_batch(dev)
                        loss, _ = _micro_batch_loss(policy, cfg, loss_cfg, empty, num_tokens, num_seqs)
                        (loss * 0.0).backward()
                    else:
                        zero_backward(policy.wrapped, dev)
            grad_norms.append(policy.clip_grad_norm())
            with explain_oom("optimizer step", partial(update_knobs, cfg, policy.sharded), dev):
                policy.optimizer.step()
            policy.scheduler.step()
    if policy.sharded and cfg.cluster.fsdp.release_full_copy:  # room for the copy's refresh
        policy.optimizer.zero_grad(set_to_none=True)
    out = {f"update/{k}": float(sum(v)) / cfg.optim.ppo_epochs for k, v in stats.items()}
    out["update/micro_batches"] = float(len(groups))
    out = merge_metrics(dist, out, summed=("update/",))  # shares of the global batch add up
    out["update/grad_norm"] = float(np.mean(grad_norms))
    out["update/lr"] = float(policy.scheduler.get_last_lr()[0])
    out["update/tokens"] = num_tokens
    return out


def _empty_batch(dev):
    """A two-token micro-batch with no token in the loss: its loss is exactly 0."""
    import torch

    ids = torch.zeros((1, 2), dtype=torch.long, device=dev)
    zeros = torch.zeros((1, 2), dtype=torch.float32, device=dev)
    return ids, torch.ones_like(ids), zeros, zeros, zeros


def _micro_batch_loss(policy: Policy, cfg: TrainConfig, loss_cfg, tensors, num_tokens, num_seqs):
    """One micro-batch's share of the batch loss and its statistics (forward under the configured
    autocast; the reference logprobs from the frozen copy or the LoRA base when the KL term is on)."""
    import torch

    from turngym.trainer.batching import mixed_precision, token_logprobs
    from turngym.trainer.loss import policy_loss

    ids, attn, mask, old, adv = tensors
    head = {"chunk_tokens": cfg.optim.logprob_chunk_tokens, "kernel": cfg.optim.logprob_kernel}
    with mixed_precision(policy.model, cfg.model.autocast):  # forward passes only
        logp, entropy = token_logprobs(
            policy.wrapped, ids, attn, with_entropy=loss_cfg.entropy_coef > 0, **head
        )
        ref = None
        if loss_cfg.kl_coef > 0:
            with torch.no_grad():
                if policy.ref_model is not None:
                    ref, _ = token_logprobs(policy.ref_model, ids, attn, **head)
                else:
                    with policy.model.disable_adapter():
                        ref, _ = token_logprobs(policy.model, ids, attn, **head)
    return policy_loss(logp, old, adv, mask, loss_cfg, ref, entropy, num_tokens, num_seqs)


def segment_sequences(
    trajs: list[Trajectory], advs: list[np.ndarray]
) -> tuple[list[Trajectory], list[np.ndarray]]:
    """One training sequence per segment. An episode recorded by ``turngym.proxy`` whose harness
    re-rendered its history holds several segments one after the other (``metadata["segments"]``:
    ``[start, end)`` spans), each prompted afresh: each is its own forward pass, with its slice of
    the advantages (credit saw the whole episode). Other trajectories pass through."""
    out_t, out_a = [], []
    for t, adv in zip(trajs, advs, strict=True):
        spans = t.metadata.get("segments") or []
        if len(spans) <= 1:
            out_t.append(t)
            out_a.append(adv)
            continue
        for start, end in spans:
            if not any(t.loss_mask[start:end]):
                continue
            part = {k: getattr(t, k)[start:end] for k in ("token_ids", "loss_mask", "logprobs")}
            out_t.append(t.model_copy(update={**part, "turns": []}))
            out_a.append(np.asarray(adv)[start:end])
    return out_t, out_a
