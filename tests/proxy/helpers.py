"""Helpers of the proxy tests: run a harness against a served proxy, play arith's expert locally."""

from __future__ import annotations

import asyncio


def run(running, command, tasks, **kw):
    from turngym.proxy.harness import run_harness

    kw.setdefault("timeout_s", 180)
    kw.setdefault("reward_timeout_s", 5)
    return asyncio.run(run_harness(command, tasks, proxy_url=running.url, api_key=running.token, **kw))


def env_return(seed: int) -> tuple[float, str, int]:
    """The arith expert's return, task id and turns for ``seed`` (the env played locally)."""
    import turngym

    env = turngym.make("arith")
    _, info = env.reset(seed=seed)
    total, turns, done = 0.0, 0, False
    while not done:
        _, r, term, trunc, _ = env.step(env.expert_action())
        total, turns, done = total + r, turns + 1, term or trunc
    return total, info["task_id"], turns
