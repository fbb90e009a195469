"""SFT warm start: supervised training on scripted-expert trajectories, loss on assistant tokens only.

    seqs = expert_sequences("arith", tokenizer, seeds=range(64))
    sft_train(model, seqs, steps=200, batch_size=8, lr=1e-3)

Expert trajectories come from the env's ``expert_action`` (``ScriptedAgent``) through the rollout
engine; they are tokenised with the same chat bookkeeping the RL rollouts use
(``turngym.agents.chat.ChatTokens``), so the model learns exactly the token layout it will sample in.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from turngym.core.types import Trajectory


@dataclass
class TokenSequence:
    token_ids: list[int]
    loss_mask: list[int]


def tokenize_trajectory(traj: Trajectory, tokenizer: Any, fmt: Any = None) -> TokenSequence:
    """Token ids of a text trajectory with loss mask 1 on the assistant's own tokens (and its stop
    token). Pass one ``ChatFormat`` for many trajectories to share its template and piece cache."""
    from turngym.agents.chat import ChatFormat, ChatTokens

    fmt = fmt or ChatFormat(tokenizer)
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tokenizer.get_vocab() else None
    stop = stop if isinstance(stop, int) else tokenizer.eos_token_id
    tokens = ChatTokens(fmt, traj.prompt)
    for k, turn in enumerate(traj.turns):
        ids = fmt.encode(turn.action.content) + [stop]
        tokens.add_generation(ids, [0.0] * len(ids))
        if k < len(traj.turns) - 1:
            tokens.add_observation(turn.action, turn.observation)
    return TokenSequence(list(tokens.token_ids), list(tokens.loss_mask))


def expert_trajectories(env: str, seeds: Iterable[int], env_kwargs: dict | None = None) -> list[Trajectory]:
    """Play the env's scripted expert on each seed; only successful (for an open-ended env: finished),
    unmasked episodes are kept."""
    from turngym.agents.scripted import ScriptedAgent
    from turngym.core.registry import spec
    from turngym.rollout.engine import RolloutConfig, RolloutEngine

    engine = RolloutEngine(env, ScriptedAgent(), RolloutConfig(group_size=1), env_kwargs=env_kwargs)
    trajs = asyncio.run(engine.run(list(seeds)))
    # an open-ended env (travel-open: judged pairwise, outcome always 0) has no success to check:
    # its expert's finished episodes are the demonstrations
    finished = spec(env).open_ended()
    return [t for t in trajs if not t.masked and t.terminated and (finished or t.outcome > 0)]


def expert_sequences(
    env: str, tokenizer: Any, seeds: Iterable[int], env_kwargs: dict | None = None
) -> list[TokenSequence]:
    from turngym.agents.chat import ChatFormat

    fmt = ChatFormat(tokenizer)
    return [tokenize_trajectory(t, tokenizer, fmt) for t in expert_trajectories(env, seeds, env_kwargs)]


def sft_train(
    model: Any,
    sequences: list[TokenSequence],
    *,
    steps: int,
    batch_size: int = 8,
    lr: float = 1e-3,
    seed: int = 0,
    max_grad_norm: float = 1.0,
    log: Any = None,
    chunk_tokens: int | None = 4096,
    autocast: str | None = None,
) -> list[float]:
    """Train on ``sequences`` for ``steps`` optimizer steps (AdamW, cosine decay); returns the losses.

    ``autocast="bfloat16"``: the forward passes run under bf16 autocast (``mixed_precision``); the
    weights and AdamW's state stay in the model's dtype."""
    import torch

    from turngym.trainer.batching import (
        mixed_precision,
        pad_right,
        token_logprobs,
        train_mode_without_dropout,
    )

    if not sequences:
        raise ValueError("no expert sequences to train on (does the env have a scripted expert?)")
    device = next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(steps, 1), eta_min=lr * 0.1)
    rng = random.Random(seed)
    losses = []
    order: list[int] = []
    with train_mode_without_dropout(model):  # train mode, or gradient checkpointing is off
        for step in range(steps):
            if len(order) < batch_size:
                order += rng.sample(range(len(sequences)), len(sequences))
            batch = [sequences[order.pop()] for _ in range(min(batch_size, len(sequences)))]
            ids = pad_right([s.token_ids for s in batch], 0, torch.long, device)
            attn = pad_right([[1] * len(s.token_ids) for s in batch], 0, torch.long, device)
            mask = pad_right([s.loss_mask for s in batch], 0, torch.float32, device)
            with mixed_precision(model, autocast):
                logp, _ = token_logprobs(model, ids, attn, chunk_tokens=chunk_tokens)
            loss = -(logp * mask).sum() / mask.sum().clamp(min=1.0)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
            opt.step()
            sched.step()
            losses.append(float(loss.detach()))
            if log is not None:
                log(step, losses[-1])
    return losses


def sft_from_config(cfg: Any, model: Any, tokenizer: Any, log: Any = None) -> dict[str, float]:
    """The warm start a training config describes (its ``sft`` section) on ``model``: the env's expert
    episodes on ``sft.tasks`` task seeds, tokenized with ``tokenizer``, then :func:`sft_train`. Returns
    ``sft/...`` metrics (first and last loss, sequences, seconds). ``turngym sft`` and the trainer's
    warm start both run this."""
    import time

    s, r = cfg.sft, cfg.rollout
    t0 = time.perf_counter()
    seeds = range(s.task_seed_offset, s.task_seed_offset + s.tasks)
    seqs = expert_sequences(r.env, tokenizer, seeds, cfg.sft_env_kwargs())
    losses = sft_train(
        model,
        seqs,
        steps=s.steps,
        batch_size=s.batch_size,
        lr=s.lr,
        seed=cfg.seed,
        autocast=cfg.model.autocast,
        log=log,
    )
    model.eval()
    return {
        "sft/loss_first": losses[0],
        "sft/loss_last": losses[-1],
        "sft/sequences": float(len(seqs)),
        "sft/seconds": time.perf_counter() - t0,
    }
