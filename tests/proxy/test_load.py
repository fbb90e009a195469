"""1,024 calls from 64 concurrent harness processes over loopback lose nothing (bounded, loopback only)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.proxy.helpers import run
from turngym.proxy import make_proxy, serve_proxy
from turngym.proxy.scripted import InstantBackend

TOKEN = "load-test-token-0123456789"
PROCESSES, CALLS, TOKENS = 64, 16, 8
HARNESS = Path(__file__).with_name("counting_harness.py")


@pytest.mark.slow
def test_64_harness_processes_of_16_calls_each_lose_nothing(tokenizer, tmp_path):
    proxy = make_proxy(backend=InstantBackend(tokenizer, TOKENS), tokenizer=tokenizer, name="m", out=tmp_path)
    command = f"{sys.executable} -S {HARNESS} {CALLS}"
    with serve_proxy(proxy, token=TOKEN) as running:
        trajs = run(running, command, ["0"], group_size=PROCESSES, concurrency=PROCESSES, reward_timeout_s=60)
    assert len(trajs) == PROCESSES
    for t in trajs:
        assert not t.masked, t.mask_reason
        assert t.metadata["harness"]["exit_code"] == 0
        assert len(t.turns) == CALLS and t.metrics["segments"] == 1 and t.total_reward == 1.0
        assert sum(t.loss_mask) == CALLS * TOKENS  # every sampled token recorded, once
    keys = {t.metadata["episode"] for t in trajs}
    assert len(keys) == PROCESSES and keys == set(proxy.store.finished) and not proxy.store.live
    lines = (tmp_path / "trajectories.jsonl").read_text().splitlines()
    assert sorted(json.loads(x)["metadata"]["episode"] for x in lines) == sorted(keys)
