"""Rollouts from an outside agent program (``rollout.source: harness``): the orchestrator's other source.

Per rollout the policy's own backend (the one an env rollout would use: the in-process HF engine
sharing the trained module, or vLLM servers that the weight sync updates) is served through
``turngym.proxy`` on loopback with a fresh token; ``rollout.harness.command`` runs G times per task
(``turngym.proxy.harness.run_harness``: concurrency limit, per-episode timeout, masks with reasons);
the episodes come back as trajectories, one turn per model call, their segments in
``metadata["segments"]`` (the update trains each segment as its own sequence). With ``reward: env``
the proxy also serves ``rollout.env``'s tools at ``{mcp_url}`` (the door of ``turngym serve --mcp``)
and each episode's reward is the env's return. Since the proxy generates with the backend of the
step, the next step's proxy serves the updated weights: the refresh is the trainer's own weight sync.

    trajs, stats = harness_rollout(cfg, backend, tokenizer, seeds=[0, 1], group_size=4, env_kwargs={})

:func:`call_ledger` gives the per-call time ledger (``rollout/call/...``): queueing behind the
episode's previous call, the backend's queue, prefill and decode, and the harness's own time between
calls.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import numpy as np

from turngym.core.plugins import load_object
from turngym.core.types import Trajectory
from turngym.trainer.config import TrainConfig

#: per-call phases of the ledger: (metric name, the turn's timing key)
CALL_PHASES = (
    ("queued", "queued"),  # behind the same episode's previous call (a harness calling in parallel)
    ("backend_queued", "generate/queued"),  # waiting for a row of the backend
    ("prefill", "generate/prefill"),
    ("decode", "generate/decode"),
    ("generate", "generate"),  # the whole backend call as the proxy waited for it
    ("harness", "harness"),  # the harness's own time since the previous reply (tools, its code)
)


def load_reward_fn(path: str) -> Any:
    """``"package.module:function"`` -> the function."""
    return load_object(path, "rollout.harness.reward_fn", must_call=True)


def harness_rollout(
    cfg: TrainConfig,
    backend: Any,
    tokenizer: Any,
    seeds: list[int],
    group_size: int,
    env_kwargs: dict[str, Any],
    *,
    keep_backend: bool = False,
) -> tuple[list[Trajectory], dict[str, Any]]:
    """``group_size`` harness runs per seed through a proxy over ``backend`` (the orchestrator's; closed
    afterwards, its buffers freed unless ``keep_backend``); returns the trajectories (task-major) and
    the rollout's stats (the env rollout's keys)."""
    from turngym.proxy.api import make_proxy, serve_proxy
    from turngym.proxy.harness import run_harness
    from turngym.trainer.metrics import backend_counters

    r, h = cfg.rollout, cfg.rollout.harness
    assert h is not None  # the config's validator
    before = backend_counters(backend)
    proxy = make_proxy(
        backend=backend,
        tokenizer=tokenizer,
        name=h.model,
        env_id=r.env,
        max_context=r.max_context,
        max_tokens=r.max_tokens,
        parser=h.parser,
        reward_fn=load_reward_fn(h.reward_fn) if h.reward_fn else None,
        reward_timeout_s=h.reward_timeout_s,
        idle_timeout_s=h.timeout_s + h.reward_timeout_s,
    )
    envs = [r.env] if h.reward == "env" else None
    try:
        with serve_proxy(proxy, token=secrets.token_urlsafe(24), envs=envs, env_kwargs=env_kwargs) as running:
            trajs = asyncio.run(
                run_harness(
                    h.command,
                    [str(s) for s in seeds],
                    proxy_url=running.url,
                    api_key=running.token,
                    group_size=group_size,
                    concurrency=h.concurrency,
                    timeout_s=h.timeout_s,
                    reward_timeout_s=h.reward_timeout_s,
                    mcp=envs is not None,
                    env=h.env,
                    cwd=h.cwd,
                )
            )
    finally:
        counters = backend_counters(backend)
        asyncio.run(backend.aclose())
        if not keep_backend and hasattr(backend, "free_buffers"):
            backend.free_buffers()  # the slots engine's KV and graphs: the update needs the room
    masked: dict[str, int] = {}
    for t in trajs:
        if t.masked:
            why = t.mask_reason.split(":")[0]
            masked[why] = masked.get(why, 0) + 1
    stats = {
        "generated_tokens": int(sum(t.metrics.get("generated_tokens", 0.0) for t in trajs)),
        "mask_reasons": masked,
        "backend": {k: v - before.get(k, 0.0) for k, v in counters.items()},
    }
    return trajs, stats


def call_ledger(trajs: list[Trajectory]) -> dict[str, float]:
    """``rollout/call/<phase>_p50`` and ``_mean`` (seconds per model call, over every call of every
    episode, masked ones included), ``rollout/call/calls``, and the drift the harness caused:
    ``rollout/harness/segments_per_episode``, ``drift_rate`` (new segments per call) and
    ``reprefill_tokens``."""
    turns = [turn for t in trajs for turn in t.turns]
    out: dict[str, float] = {"rollout/call/calls": float(len(turns))}
    for name, key in CALL_PHASES:
        values = [turn.timing[key] for turn in turns if key in turn.timing]
        if values:
            out[f"rollout/call/{name}_p50"] = float(np.median(values))
            out[f"rollout/call/{name}_mean"] = float(np.mean(values))
    if trajs:
        out["rollout/harness/segments_per_episode"] = float(
            np.mean([t.metrics.get("segments", 0.0) for t in trajs])
        )
        out["rollout/harness/drift_rate"] = sum(t.metrics.get("drift", 0.0) for t in trajs) / max(
            len(turns), 1
        )
        out["rollout/harness/reprefill_tokens"] = float(
            sum(t.metrics.get("reprefill_tokens", 0.0) for t in trajs)
        )
        walls = [t.metadata.get("harness", {}).get("wall_s") for t in trajs]
        walls = [w for w in walls if w is not None]
        if walls:
            out["rollout/harness/episode_wall_s_mean"] = float(np.mean(walls))
    return out
