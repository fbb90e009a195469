"""HF backend: continuous batching (join/leave between decode steps), greedy batched == unbatched,
per-request seeds, raw logprobs, stops, weight updates, close."""

import asyncio
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from turngym.agents import BackendError, SamplingParams
from turngym.agents.hf import HFBackend

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=(2,))


def prompts(tokenizer):
    texts = [
        "Evaluate: (3 + 4)",
        "hello world " * 5,
        "<tool_call>",
        "The number is 42 and the city is far " * 3,
    ]
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


async def test_greedy_batched_equals_unbatched(hf_backend, tokenizer):
    ps = prompts(tokenizer)
    alone = [hf_backend.generate_batch([p], [GREEDY])[0] for p in ps]
    before = Counter(hf_backend.stats["widths"])
    together = await asyncio.gather(*(hf_backend.generate(p, GREEDY) for p in ps))
    widths = hf_backend.stats["widths"] - before
    assert max(widths) > 1  # concurrent requests shared decode steps
    for a, b in zip(alone, together, strict=True):
        assert a.token_ids == b.token_ids
        assert a.finish_reason == b.finish_reason
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)


def test_logprobs_are_raw_model_logprobs_of_sampled_tokens(hf_backend, tokenizer):
    p = prompts(tokenizer)[0]
    hot = SamplingParams(max_tokens=8, temperature=1.7, top_k=20)  # sampling settings must not change them
    gen = hf_backend.generate_batch([p], [hot])[0]
    with torch.no_grad():
        logits = hf_backend.model(torch.tensor([p + gen.token_ids])).logits[0].float()
    ref = torch.log_softmax(logits, -1)
    expected = [ref[len(p) - 1 + i, t].item() for i, t in enumerate(gen.token_ids)]
    assert gen.logprobs == pytest.approx(expected, abs=1e-4)


def test_each_request_stops_at_its_own_limit(hf_backend, tokenizer):
    ps = prompts(tokenizer)[:2]
    gens = hf_backend.generate_batch(ps, [GREEDY.replace(max_tokens=3), GREEDY.replace(max_tokens=9)])
    assert [len(g.token_ids) for g in gens] == [3, 9]
    assert all(g.finish_reason == "length" for g in gens)
    # a stop token ends a generation and is kept as its last id
    first = gens[1].token_ids[2]
    stopped = hf_backend.generate_batch([ps[1]], [GREEDY.replace(max_tokens=9, stop_token_ids=(first,))])[0]
    assert stopped.finish_reason == "stop" and stopped.token_ids[-1] == first
    assert stopped.token_ids == gens[1].token_ids[: len(stopped.token_ids)]
    assert stopped.text == tokenizer.decode(stopped.token_ids, skip_special_tokens=True)


async def test_mixed_sampling_settings_are_served_in_groups(hf_backend, tokenizer):
    ps = prompts(tokenizer)
    hot = SamplingParams(max_tokens=5, temperature=1.0, stop_token_ids=(2,))
    gens = await asyncio.gather(*(hf_backend.generate(p, GREEDY if i % 2 else hot) for i, p in enumerate(ps)))
    assert all(1 <= len(g.token_ids) <= 12 for g in gens)
    assert [len(g.token_ids) <= 5 for g in gens[::2]] == [True, True]


async def test_bad_requests_raise_backend_error(hf_backend, tokenizer):
    with pytest.raises(BackendError, match="empty prompt"):
        await hf_backend.generate([], GREEDY)
    with pytest.raises(BackendError, match="adapters"):
        await hf_backend.generate([5, 6], GREEDY, adapter="lora")
    with pytest.raises(BackendError, match=r"outside the vocabulary .*\[-1, 10000000\]"):
        await hf_backend.generate([5, -1, 10**7, 6], GREEDY)
    for wrong in ([5, 6.5], [5, "6"], [5, None]):  # a float is not silently truncated to a token id
        with pytest.raises(BackendError, match="must be integers"):
            await hf_backend.generate(wrong, GREEDY)
    import numpy as np

    ids = (await hf_backend.generate([5, 6], GREEDY)).token_ids  # the worker survives
    assert (await hf_backend.generate(list(np.array([5, 6])), GREEDY)).token_ids == ids  # numpy ints are ids


def test_update_weights_changes_generations(tiny_dir, tokenizer):
    backend = HFBackend(tiny_dir, tokenizer)
    p = prompts(tokenizer)[0]
    before = backend.generate_batch([p], [GREEDY])[0]
    state = {
        k: v * 3.0 if k.endswith("mlp.down_proj.weight") else v for k, v in backend.model.state_dict().items()
    }
    backend.update_weights(state)
    after = backend.generate_batch([p], [GREEDY])[0]
    assert after.logprobs != before.logprobs


@pytest.fixture(scope="module")
def fused_backend(tiny_dir, tokenizer):
    """Joiners prefilled inside the running rows' decode pass (the CUDA default), here on CPU."""
    return HFBackend(tiny_dir, tokenizer, max_batch_size=16, max_wait_ms=20, fuse_tokens=10**6)


@pytest.mark.parametrize("fused", [False, True], ids=["prefill_pass", "fused_pass"])
async def test_requests_join_and_leave_between_decode_steps(fused, hf_backend, fused_backend, tokenizer):
    backend = fused_backend if fused else hf_backend
    long_p, short_p = prompts(tokenizer)[2], prompts(tokenizer)[3] * 2  # the joiner's prompt is longer
    long_s = SamplingParams(max_tokens=80, temperature=0.0, stop_token_ids=(-1,))
    long_alone = backend.generate_batch([long_p], [long_s])[0]
    short_alone = backend.generate_batch([short_p], [GREEDY.replace(max_tokens=3)])[0]
    stats0 = dict(backend.stats)
    finished: list[str] = []

    async def run(name, p, s):
        gen = await backend.generate(p, s)
        finished.append(name)
        return gen

    long_task = asyncio.create_task(run("long", long_p, long_s))
    while backend.stats["steps"] - stats0["steps"] < 5:  # the long request is decoding
        await asyncio.sleep(0.001)
    short = await run("short", short_p, GREEDY.replace(max_tokens=3))
    long = await long_task
    # the short request joined the running batch and left it long before the long one ended
    assert finished == ["short", "long"]
    assert len(long.token_ids) == 80
    assert short.token_ids == short_alone.token_ids
    assert long.token_ids == long_alone.token_ids  # joining and leaving rows do not disturb a row
    assert long.logprobs == pytest.approx(long_alone.logprobs, abs=1e-4)
    if fused:  # one pass admitted the joiner, and its padding was compacted away after it left
        assert backend.stats["fused"] > stats0["fused"]
        assert backend.stats["prefills"] == stats0["prefills"] + 1  # only the long request's own
        assert backend.stats["compactions"] > stats0["compactions"]
    else:
        assert backend.stats["prefills"] > stats0["prefills"] and backend.stats["fused"] == stats0["fused"]


async def test_fused_admission_matches_unbatched_greedy(fused_backend, tokenizer):
    ps = prompts(tokenizer) * 2
    samplings = [GREEDY.replace(max_tokens=60 - 6 * i, stop_token_ids=(-1,)) for i in range(len(ps))]
    alone = [fused_backend.generate_batch([p], [s])[0] for p, s in zip(ps, samplings, strict=True)]
    steps0, fused0 = fused_backend.stats["steps"], fused_backend.stats["fused"]

    async def staggered(i):  # request i arrives after i decode steps, while request 0 still runs
        while fused_backend.stats["steps"] < steps0 + i:
            await asyncio.sleep(0.001)
        return await fused_backend.generate(ps[i], samplings[i])

    together = await asyncio.gather(*(staggered(i) for i in range(len(ps))))
    assert fused_backend.stats["fused"] > fused0
    for a, b in zip(alone, together, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)


def test_a_seed_gives_the_same_sample_whatever_the_batch(hf_backend, tokenizer):
    ps = prompts(tokenizer)
    s = SamplingParams(max_tokens=10, temperature=1.0, top_p=0.95, top_k=50, seed=7)
    alone = hf_backend.generate_batch([ps[0]], [s])[0]
    others = [s.replace(seed=1), s.replace(temperature=0.0), s.replace(seed=3, max_tokens=2)]
    mixed = hf_backend.generate_batch([ps[1], ps[2], ps[0], ps[3]], [others[0], others[1], s, others[2]])
    assert mixed[2].token_ids == alone.token_ids
    assert mixed[2].logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    reseeded = [hf_backend.generate_batch([ps[0]], [s.replace(seed=k)])[0].token_ids for k in range(4)]
    assert len({tuple(r) for r in reseeded}) > 1  # other seeds sample other tokens


def test_truncated_sampling_collapses_to_greedy(hf_backend, tokenizer):
    p = prompts(tokenizer)[0]
    greedy = hf_backend.generate_batch([p], [GREEDY])[0]
    for s in (GREEDY.replace(temperature=1.0, top_k=1, seed=3), GREEDY.replace(temperature=2.0, top_p=1e-6)):
        assert hf_backend.generate_batch([p], [s])[0].token_ids == greedy.token_ids


async def test_a_caller_that_gives_up_frees_its_row(hf_backend, tokenizer):
    p = prompts(tokenizer)[1]
    s = SamplingParams(max_tokens=100_000, temperature=1.0, stop_token_ids=(-1,))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(hf_backend.generate(p, s), 0.2)
    gen = await hf_backend.generate(p, GREEDY)  # served; the abandoned row was retired
    assert gen.token_ids and gen.finish_reason in ("stop", "length")
    await asyncio.sleep(0.05)
    steps = hf_backend.stats["steps"]
    await asyncio.sleep(0.2)
    assert hf_backend.stats["steps"] == steps  # nothing left decoding


async def decoding(backend, prompt, max_tokens, steps):
    """A greedy generation that never stops early, started and run for ``steps`` decode steps."""
    s = SamplingParams(max_tokens=max_tokens, temperature=0.0, stop_token_ids=(-1,))
    task = asyncio.create_task(backend.generate(prompt, s))
    while backend.stats["steps"] < steps:
        await asyncio.sleep(0.001)
    return task


async def test_update_weights_lands_between_decode_steps(tiny_dir, tokenizer):
    backend = HFBackend(tiny_dir, tokenizer)
    task = await decoding(backend, prompts(tokenizer)[1], max_tokens=60, steps=3)
    await asyncio.to_thread(backend.update_weights, backend.model.state_dict())
    gen = await task
    first, last = gen.meta["weights_version"]
    assert (first, last) == (0, 1)  # the update landed mid-generation, between two steps
    assert backend.weights_version == 1
    await backend.aclose()


async def test_aclose_fails_pending_requests_and_the_backend_restarts(tiny_dir, tokenizer):
    backend = HFBackend(tiny_dir, tokenizer)
    p = prompts(tokenizer)[0]
    task = await decoding(backend, p, max_tokens=100_000, steps=1)
    await backend.aclose()
    with pytest.raises(BackendError, match="closed"):
        await task
    assert (await backend.generate(p, GREEDY)).token_ids  # a new call starts a new scheduler
    await backend.aclose()


@settings(max_examples=30)
@given(
    steps=st.lists(st.tuples(st.integers(1, 40), st.booleans()), min_size=1, max_size=40),
    rows=st.integers(1, 4),
)
def test_the_kv_cache_grows_in_place_and_equals_concatenation(tiny_dir, steps, rows):
    """Each update writes its columns into spare buffer space (no per-step copy of the cache); the
    scheduler may replace keys/values between steps (rows leave), after which the layer moves into
    a new buffer. The visible keys/values always equal plain concatenation."""
    from transformers import AutoConfig

    from turngym.agents.hf.kv.padded import growing_cache as _growing_cache

    layer = _growing_cache(AutoConfig.from_pretrained(tiny_dir)).layers[0]
    ref_k = ref_v = torch.zeros((rows, 2, 0, 8))
    buffers: list = []  # kept alive, so no two buffers can share an address
    for n, drop_row in steps:
        if drop_row and ref_k.shape[0] > 1 and ref_k.shape[2]:  # a row leaves: the scheduler indexes
            layer.keys, layer.values = layer.keys[1:], layer.values[1:]
            ref_k, ref_v = ref_k[1:], ref_v[1:]
        k, v = torch.randn((ref_k.shape[0], 2, n, 8)), torch.randn((ref_k.shape[0], 2, n, 8))
        keys, values = layer.update(k, v)
        ref_k, ref_v = torch.cat([ref_k, k], dim=2), torch.cat([ref_v, v], dim=2)
        assert torch.equal(keys, ref_k) and torch.equal(values, ref_v)
        if not any(b is layer._kbuf for b in buffers):
            buffers.append(layer._kbuf)
    drops = sum(d for _, d in steps)
    assert len(buffers) <= drops + 1 + sum(n for n, _ in steps) // 64  # amortized: rare reallocation


def test_passes_turn_cudnn_attention_off_and_restore_it_across_threads():
    """The flag is process-wide: overlapping passes of two scheduler threads must leave the caller's
    setting as it was, and it must stay off while any pass runs."""
    import threading

    import torch

    from turngym.agents.hf.runner.eager import WithoutCudnnAttention as _WithoutCudnnAttention

    before = torch.backends.cuda.cudnn_sdp_enabled()
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def a():
        with _WithoutCudnnAttention():
            a_in.set()
            b_in.wait(5)
        a_out.set()

    def b():
        a_in.wait(5)
        with _WithoutCudnnAttention():
            b_in.set()
            a_out.wait(5)  # a's pass ended first, while b's still runs
            seen["b_after_a"] = torch.backends.cuda.cudnn_sdp_enabled()

    threads = [threading.Thread(target=f) for f in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == {"b_after_a": False}
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
    torch.backends.cuda.enable_cudnn_sdp(False)  # a caller that had turned it off keeps it off
    with _WithoutCudnnAttention():
        pass
    assert torch.backends.cuda.cudnn_sdp_enabled() is False
    torch.backends.cuda.enable_cudnn_sdp(before)


async def test_an_error_merging_a_joiner_fails_the_live_rows_at_once_and_the_backend_goes_on(
    tiny_dir, tokenizer, monkeypatch
):
    """Out of memory while a prefilled joiner's cache is merged into the running batch (met on an
    H100 with six trainers on one card): the running row and the joiner get the error at once (not
    after a turn timeout, as when the error killed the scheduler thread), and the next call works."""
    backend = HFBackend(tiny_dir, tokenizer, max_wait_ms=1, fuse_tokens=0)  # joiners: a pass of their own
    p_long, p_join = prompts(tokenizer)[1], prompts(tokenizer)[0]
    real_merge = backend.scheduler.kv.merge

    def merge(batch, part):
        if batch.rows:  # the first request starts the batch; the joiner's merge fails
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 56.00 MiB.")
        real_merge(batch, part)

    monkeypatch.setattr(backend.scheduler.kv, "merge", merge)
    running = await decoding(backend, p_long, max_tokens=100_000, steps=2)
    joiner = asyncio.create_task(backend.generate(p_join, GREEDY))
    for task in (running, joiner):
        with pytest.raises(BackendError, match="OutOfMemoryError: CUDA out of memory"):
            await asyncio.wait_for(task, timeout=30)
    monkeypatch.setattr(backend.scheduler.kv, "merge", real_merge)
    alone = backend.generate_batch([p_join], [GREEDY])[0]
    assert (await backend.generate(p_join, GREEDY)).token_ids == alone.token_ids
    await backend.aclose()
