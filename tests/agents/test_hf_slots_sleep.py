"""The slots engine's sleep and wake (``HFSlotBackend.sleep``/``wake``) on CPU: the KV slots are
given back (no tensor holds their storage), greedy rollouts after a wake equal those before, a
request while asleep is refused, and sleeping or waking twice is harmless. The CUDA-graph side (the
graphs a ``"kv"`` sleep keeps, the memory an update gains): benchmarks/gpu_sleep_wake.sh."""

import asyncio
import gc
import weakref

import pytest

from turngym.agents import BackendError, SamplingParams
from turngym.agents.hf import EngineAsleep, HFSlotBackend

GREEDY = SamplingParams(max_tokens=10, temperature=0.0, stop_token_ids=(-1,))


@pytest.fixture(scope="module")
def model(tiny_dir):
    from turngym.agents.models import load_model

    return load_model(tiny_dir)


@pytest.fixture
def backend(model, tokenizer):
    return HFSlotBackend(model, tokenizer, max_batch_size=4, max_wait_ms=20, max_context=128)


def prompts(tokenizer):
    texts = ["Evaluate: (3 + 4)", "hello world " * 4, "The city is far " * 3]
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


async def rollout(backend, ps):
    """Two turns per prompt on one route each (the second reuses the first's parked row)."""

    async def one(i, p):
        first = await backend.generate(p, GREEDY, route=f"r{i}")
        return first, await backend.generate(p + first.token_ids + p[:3], GREEDY, route=f"r{i}")

    return await asyncio.gather(*(one(i, p) for i, p in enumerate(ps)))


@pytest.mark.parametrize("level", ["kv", "kv+graphs"])
async def test_sleep_gives_the_kv_back_and_greedy_rollouts_after_wake_equal_those_before(
    backend, tokenizer, level
):
    ps = prompts(tokenizer)
    before = await rollout(backend, ps)
    await backend.aclose()
    arena = weakref.ref(backend.kv.arena)
    keys = [weakref.ref(k) for k in backend.kv.cache.keys]
    assert arena() is not None and arena().untyped_storage().nbytes() == backend.kv_bytes

    assert backend.sleep(level) == backend.kv_bytes
    gc.collect()
    assert arena() is None and all(k() is None for k in keys)  # no tensor holds the slots' storage
    assert backend.kv.cache is None and backend.asleep == level
    assert (backend.runner.ids is None) == (level == "kv+graphs")  # the static inputs go with the graphs

    backend.wake()
    assert backend.asleep is None and backend.kv.arena.untyped_storage().nbytes() == backend.kv_bytes
    after = await rollout(backend, ps)
    await backend.aclose()
    for (a1, a2), (b1, b2) in zip(before, after, strict=True):
        assert a1.token_ids == b1.token_ids and a2.token_ids == b2.token_ids
        assert b2.logprobs == pytest.approx(a2.logprobs, abs=1e-5)
    assert backend.stats["sleeps"] == backend.stats["wakes"] == 1
    assert backend.stats["sleep_s"] >= 0 and backend.stats["wake_s"] >= 0


async def test_a_request_while_asleep_is_refused_with_what_to_do(backend, tokenizer):
    p = prompts(tokenizer)[0]
    await backend.generate(p, GREEDY)
    await backend.aclose()
    backend.sleep("kv")
    with pytest.raises(EngineAsleep, match=r"asleep .*sleep\('kv'\).* wake\(\) it before generating"):
        await backend.generate(p, GREEDY)
    with pytest.raises(BackendError, match="asleep"):  # the sync path too, and it is a BackendError
        backend.generate_batch([p], [GREEDY])
    with pytest.raises(EngineAsleep):
        backend.precapture()  # would take the slots back behind the sleep's back
    assert backend.kv.cache is None  # nothing above allocated them
    backend.wake()
    assert (await backend.generate(p, GREEDY)).token_ids
    await backend.aclose()


async def test_sleeping_twice_and_waking_twice_are_harmless(backend, tokenizer):
    p = prompts(tokenizer)[1]
    ref = await backend.generate(p, GREEDY)
    await backend.aclose()
    assert backend.sleep("kv") == backend.kv_bytes
    assert backend.sleep("kv") == 0  # already asleep at this level
    assert backend.runner.ids is not None
    assert backend.sleep("kv+graphs") == 0  # deeper: the graphs and static inputs go too, no KV left
    assert backend.runner.ids is None and backend.asleep == "kv+graphs"
    assert backend.sleep("kv") == 0 and backend.asleep == "kv+graphs"  # never shallower
    backend.wake()
    backend.wake()
    assert backend.stats["wakes"] == 1 and backend.stats["sleeps"] == 2
    assert (await backend.generate(p, GREEDY)).token_ids == ref.token_ids
    await backend.aclose()
    backend.free_buffers()  # a closed engine may still be freed whole, asleep or not
    backend.sleep()
    backend.free_buffers()
    backend.wake()
    assert (await backend.generate(p, GREEDY)).token_ids == ref.token_ids
    await backend.aclose()


async def test_sleep_while_serving_and_an_unknown_level_are_refused(backend, tokenizer):
    p = prompts(tokenizer)[0]
    await backend.generate(p, GREEDY)
    with pytest.raises(RuntimeError, match=r"sleep\(\) while the backend is serving: aclose\(\) it first"):
        backend.sleep()
    await backend.aclose()
    with pytest.raises(ValueError, match="sleep level must be one of kv, kv\\+graphs, got 'weights'"):
        backend.sleep("weights")
    assert backend.asleep is None and backend.kv.cache is not None


def test_the_gpu_sleep_benchmark_runs_its_plumbing_on_cpu(tmp_path):
    """benchmarks/sleep_wake.py (what benchmarks/gpu_sleep_wake.sh runs on a GPU) on the tiny shape:
    every mode and cycle, an update between sleep and wake, the same greedy tokens after each wake."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).parents[2]
    out = tmp_path / "sw.json"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
    args = [
        "--shape=tiny",
        "--device=cpu",
        "--rows=4",
        "--prompt-len=8",
        "--max-tokens=6",
        "--max-context=64",
    ]
    args += ["--update-seqs=2", "--update-len=16", "--cycles=2", f"--out={out}"]
    proc = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "sleep_wake.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["card"] == "cpu" and "mode | cycle | free_gib" in proc.stdout
    assert [(r["mode"], r["cycle"]) for r in result["rows"]] == [
        (m, c) for m in ("awake", "kv", "kv+graphs") for c in (0, 1)
    ]
    for r in result["rows"]:
        assert r["update"] == "ok" and r["equal"] and r["rows_equal"] == 4
        assert r["graphs"] == "-" and r["captures"] == 0  # no CUDA graphs on CPU
        assert r["free_gib"] is None and r["sleep_s"] >= 0 and r["wake_s"] >= 0


@pytest.mark.gpu
@pytest.mark.parametrize("taken", [False, True], ids=["free", "taken"])
@pytest.mark.parametrize("level", ["kv", "kv+graphs"])
async def test_on_cuda_the_graphs_are_kept_only_at_the_same_address_and_rollouts_are_unchanged(
    tiny_dir, tokenizer, level, taken
):
    """With CUDA graphs: a sleep gives the slots' bytes back to the device; the "update" in between
    (``taken``: a tensor of the slots' size allocated while asleep, held across the wake, so the
    slots cannot come back where they were if it took their place) leaves the verdict honest — graphs
    kept only at the old address, else captured again — and the greedy tokens after the wake are
    the ones before."""
    import torch

    backend = HFSlotBackend(
        tiny_dir, tokenizer, device="cuda", dtype=torch.float32, max_batch_size=4, max_context=128
    )
    ps = prompts(tokenizer)
    assert backend.precapture() > 0  # every decode bucket: a later capture is a recapture
    await rollout(backend, ps)  # and this workload's prefill graphs
    before = await rollout(backend, ps)
    assert backend.stats["graph_replays"] > 0 and backend.cuda_graphs
    await backend.aclose()
    old, captures = backend.kv.address, backend.stats["graph_captures"]
    torch.cuda.synchronize()
    free = torch.cuda.mem_get_info()[0]
    backend.sleep(level)
    assert torch.cuda.mem_get_info()[0] >= free + backend.kv_bytes - 2**21  # the device has them back
    update = torch.empty(backend.kv_bytes, dtype=torch.uint8, device="cuda") if taken else None
    backend.wake()
    kept, dropped = backend.stats["wake_graphs_kept"], backend.stats["wake_graphs_dropped"]
    if level == "kv+graphs":
        assert kept == dropped == 0 and not backend.runner.graphs.graphs
    else:
        assert kept + dropped == 1 and kept == (backend.kv.address == old)
        if update is not None and update.data_ptr() == old:
            assert dropped == 1  # the update holds the old address: the graphs cannot be kept
    after = await rollout(backend, ps)
    await backend.aclose()
    recaptured = backend.stats["graph_captures"] - captures
    assert (recaptured == 0) == (level == "kv" and kept == 1)
    for (a1, a2), (b1, b2) in zip(before, after, strict=True):
        assert a1.token_ids == b1.token_ids and a2.token_ids == b2.token_ids
    del update
    backend.free_buffers()
