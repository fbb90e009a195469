"""The slots engine (``HFSlotBackend``) on CPU, where its decode steps run eagerly: the same ids as
the continuous engine (batched, staggered, multi-turn with prefix reuse), per-request seeds that do
not depend on the batch, its seeded noise, its context limits, more requests than slots, weight
updates, cancellation, models it refuses, and the engine registry. CUDA graphs: test_hf_cuda.py."""

import asyncio

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from turngym.agents import BackendError, SamplingParams
from turngym.agents.hf import HFBackend, HFSlotBackend
from turngym.agents.hf.registry import hf_backend_class, make_hf_backend, resolve_hf_engine
from turngym.agents.hf.sampling import pick, seeded_uniform, seeded_uniforms

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=(-1,))


def prompts(tokenizer):
    texts = [
        "Evaluate: (3 + 4)",
        "hello world " * 5,
        "<tool_call>",
        "The number is 42 and the city is far " * 3,
    ]
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


@pytest.fixture(scope="module")
def model(tiny_dir):
    from turngym.agents.models import load_model

    return load_model(tiny_dir)


@pytest.fixture
def slots(model, tokenizer):
    return HFSlotBackend(model, tokenizer, max_batch_size=8, max_wait_ms=20, max_context=256)


@pytest.fixture
def continuous(model, tokenizer):
    return HFBackend(model, tokenizer, max_batch_size=8, max_wait_ms=20)


async def test_batched_greedy_equals_the_continuous_engine(slots, continuous, tokenizer):
    ps = prompts(tokenizer)
    samplings = [
        GREEDY.replace(max_tokens=4 + 5 * i) for i in range(len(ps))
    ]  # rows leave at different steps
    ref = continuous.generate_batch(ps, samplings)
    together = await asyncio.gather(*(slots.generate(p, s) for p, s in zip(ps, samplings, strict=True)))
    alone = [slots.generate_batch([p], [s])[0] for p, s in zip(ps, samplings, strict=True)]
    assert max(slots.stats["widths"]) > 1 and slots.stats["eager_decodes"] > 0
    assert slots.stats["graph_replays"] == 0  # no graphs on CPU
    for a, b, c in zip(ref, together, alone, strict=True):
        assert a.token_ids == b.token_ids == c.token_ids
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
        assert a.finish_reason == b.finish_reason == "length"
        assert set(b.meta["timing"]) == {"queued", "prefill", "decode"}
    await slots.aclose()


async def test_staggered_joiners_do_not_disturb_running_rows(slots, tokenizer):
    ps = prompts(tokenizer) * 2
    samplings = [GREEDY.replace(max_tokens=40 - 4 * i) for i in range(len(ps))]
    alone = [slots.generate_batch([p], [s])[0] for p, s in zip(ps, samplings, strict=True)]
    steps0 = slots.stats["steps"]

    async def staggered(i):  # request i arrives after i decode steps, while the first still runs
        while slots.stats["steps"] < steps0 + i:
            await asyncio.sleep(0.001)
        return await slots.generate(ps[i], samplings[i])

    together = await asyncio.gather(*(staggered(i) for i in range(len(ps))))
    assert slots.stats["prefills"] > len(ps)  # joiners were prefilled while others decoded
    for a, b in zip(alone, together, strict=True):
        assert a.token_ids == b.token_ids
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
    await slots.aclose()


async def test_turns_resume_their_parked_slot_and_match_full_prefills(model, tokenizer, continuous):
    reuse = HFSlotBackend(model, tokenizer, max_batch_size=4, max_context=512)
    obs = tokenizer.encode(" observation: 17", add_special_tokens=False)

    async def turns(backend, prompt, route):
        out = []
        for turn in range(3):
            gen = await backend.generate(prompt, GREEDY.replace(max_tokens=6 + turn), route=route)
            out.append(gen.token_ids)
            prompt = prompt + gen.token_ids + obs
        backend.release(route)
        return out

    ps = prompts(tokenizer)
    got = await asyncio.gather(*(turns(reuse, p, f"r{i}") for i, p in enumerate(ps)))
    ref = [await turns(continuous, p, f"r{i}") for i, p in enumerate(ps)]
    assert got == ref
    assert reuse.stats["reused_tokens"] > 0
    assert reuse.stats["parked_evicted"] == 0  # four routes over four slots: every turn found its row
    # a prompt that diverges from the parked row reuses only the common prefix
    first = await reuse.generate(ps[3], GREEDY, route="d")
    fed0 = reuse.stats["prompt_tokens"]
    diverged = ps[3][:5] + obs
    second = await reuse.generate(diverged, GREEDY, route="d")
    assert reuse.stats["prompt_tokens"] - fed0 == len(diverged) - 5
    assert second.token_ids == continuous.generate_batch([diverged], [GREEDY])[0].token_ids
    assert first.token_ids
    # the four released rows were freed at the next placement: drops, not evictions
    assert reuse.stats["parked_dropped"] >= 4 and reuse.stats["parked_evicted"] == 0
    await reuse.aclose()
    await continuous.aclose()


async def test_more_requests_than_slots_wait_for_a_slot(model, tokenizer, continuous):
    two = HFSlotBackend(model, tokenizer, max_batch_size=2, max_context=128)
    ps = prompts(tokenizer) * 2
    gens = await asyncio.wait_for(
        asyncio.gather(*(two.generate(p, GREEDY, route=f"r{i}") for i, p in enumerate(ps))), 60
    )
    assert max(two.stats["widths"]) == 2
    assert two.stats["parked_evicted"] == 6  # eight routes through two slots: parked rows make room
    assert [g.token_ids for g in gens] == [
        g.token_ids for g in continuous.generate_batch(ps, [GREEDY] * len(ps))
    ]
    await two.aclose()


def test_a_seed_gives_the_same_sample_whatever_the_batch(slots, tokenizer):
    ps = prompts(tokenizer)
    s = SamplingParams(max_tokens=10, temperature=1.0, top_p=0.95, top_k=50, seed=7)
    alone = slots.generate_batch([ps[0]], [s])[0]
    others = [s.replace(seed=1), s.replace(temperature=0.0), s.replace(seed=3, max_tokens=2)]
    mixed = slots.generate_batch([ps[1], ps[2], ps[0], ps[3]], [others[0], others[1], s, others[2]])
    assert mixed[2].token_ids == alone.token_ids
    assert mixed[2].logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    again = slots.generate_batch([ps[0]], [s.replace(seed=8)])[0]
    assert again.token_ids != alone.token_ids  # 10 tokens of a near-uniform tiny model


def test_logprobs_are_raw_model_logprobs_of_sampled_tokens(slots, tokenizer):
    p = prompts(tokenizer)[0]
    gen = slots.generate_batch([p], [SamplingParams(max_tokens=8, temperature=1.7, top_k=20, seed=3)])[0]
    with torch.no_grad():
        logits = slots.model(torch.tensor([p + gen.token_ids])).logits[0].float()
    ref = torch.log_softmax(logits, -1)
    assert gen.logprobs == pytest.approx(
        [ref[len(p) - 1 + i, t].item() for i, t in enumerate(gen.token_ids)], abs=1e-4
    )


@settings(max_examples=200)
@given(seed=st.integers(-(2**63), 2**63 - 1), index=st.integers(0, 10**6))
def test_seeded_uniform_is_a_pure_function_inside_the_unit_interval(seed, index):
    u = seeded_uniform(seed, index)
    assert 0 < u < 1 and u == seeded_uniform(seed, index)


@settings(max_examples=100)
@given(
    seeds=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=8),
    index=st.integers(0, 2**31 - 16),
)
def test_seeded_uniforms_on_tensors_equal_the_scalar_draws(seeds, index):
    """The decode block's in-graph draws (int64 tensor arithmetic, no overflow) are bit for bit the
    host's ``seeded_uniform`` of the same seed and token index."""
    lo = torch.tensor([s & 0xFFFFFFFF for s in seeds])
    hi = torch.tensor([(s >> 32) & 0xFFFFFFFF for s in seeds])
    steps = torch.arange(4)[:, None]
    u = seeded_uniforms(lo, hi, index + steps)
    assert u.dtype == torch.float32 and u.shape == (4, len(seeds))
    want = torch.tensor(
        [[seeded_uniform(s, index + j) for s in seeds] for j in range(4)], dtype=torch.float32
    )
    assert torch.equal(u, want)


async def test_decode_blocks_give_the_tokens_of_single_steps(model, tokenizer):
    """Blocks of 2, 4 or 8 steps a graph replay (single steps once no row has a block left) give the
    tokens, logprobs and finish reasons of single steps: rows that stop inside a block (stop token,
    max_tokens, the end of the context) keep only their tokens up to there, seeded samples draw the
    same, and turns resume their rows."""
    probe = HFSlotBackend(model, tokenizer, max_batch_size=2, max_context=128)
    ps = prompts(tokenizer)
    stop = probe.generate_batch([ps[3]], [GREEDY])[0].token_ids[5]  # a token the model does sample
    samplings = [GREEDY.replace(max_tokens=3 + 7 * i, stop_token_ids=(stop,)) for i in range(len(ps))] + [
        SamplingParams(max_tokens=11, temperature=1.0, top_k=30, seed=9)
    ]
    ps = ps + [ps[0]]

    async def run(block: int):
        b = HFSlotBackend(model, tokenizer, max_batch_size=8, max_context=128, decode_block=block)
        gens = await asyncio.gather(
            *(b.generate(p, s, route=f"r{i}") for i, (p, s) in enumerate(zip(ps, samplings, strict=True)))
        )
        again = await asyncio.gather(
            *(
                b.generate(p + g.token_ids + p[:3], s, route=f"r{i}")
                for i, (p, g, s) in enumerate(zip(ps, gens, samplings, strict=True))
            )
        )
        long = await b.generate(list(range(5, 115)), GREEDY.replace(max_tokens=40))  # ends at the context
        out = [(g.token_ids, g.logprobs, g.finish_reason) for g in [*gens, *again, long]]
        stats = dict(b.stats)
        await b.aclose()
        return out, stats

    ref, one = await run(1)
    assert one["decode_blocks"] == one["steps"]
    assert any(r[2] == "stop" for r in ref) and ref[-1][2] == "length"
    for block in (2, 4, 8):
        got, stats = await run(block)
        assert stats["decode_blocks"] < stats["steps"]
        for (ids_a, lp_a, fin_a), (ids_b, lp_b, fin_b) in zip(ref, got, strict=True):
            assert ids_a == ids_b and fin_a == fin_b
            assert lp_a == pytest.approx(lp_b, abs=1e-5)


async def test_overlapped_prefill_gives_the_tokens_of_a_read_back_prefill(model, tokenizer):
    """With ``overlap_prefill`` the decode block is queued behind a prefill pass before its first
    tokens are read: joiners that arrive while other rows decode get the same tokens, logprobs,
    finish reasons and resumed turns as with the first tokens read back before the block, among them
    a joiner whose first token is its stop token (it rides a block and keeps none of it), one with
    ``max_tokens=1``, one whose prompt fills the context, and seeded samples."""
    probe = HFSlotBackend(model, tokenizer, max_batch_size=2, max_context=128)
    ps = prompts(tokenizer)
    first = probe.generate_batch([ps[2]], [GREEDY])[0].token_ids[0]
    await probe.aclose()
    jobs = [
        (ps[0], GREEDY.replace(max_tokens=30)),  # decodes while the others join
        (ps[1], SamplingParams(max_tokens=20, temperature=1.0, seed=4)),
        (ps[2], GREEDY.replace(stop_token_ids=(first,))),  # stops at its first token
        (ps[3], GREEDY.replace(max_tokens=1)),
        (list(range(5, 133)), GREEDY),  # 128 tokens: the whole context
        (ps[0][:3], SamplingParams(max_tokens=9, temperature=0.8, top_p=0.9, seed=2)),
    ]

    ARRIVE = [0, 8, 16, 24, 25, 26]  # the first job's blocks: 8 steps, then single steps

    async def run(overlap: bool):
        b = HFSlotBackend(model, tokenizer, max_batch_size=8, max_context=128, overlap_prefill=overlap)
        steps0 = b.stats["steps"]

        async def joining(i, p, s):  # job i arrives after ARRIVE[i] decode steps: one a block
            while b.stats["steps"] < steps0 + ARRIVE[i]:
                await asyncio.sleep(0.001)
            g = await b.generate(p, s, route=f"r{i}")
            again = await b.generate(p + g.token_ids + p[:2], s, route=f"r{i}") if len(p) < 100 else g
            return g, again

        out = await asyncio.gather(*(joining(i, p, s) for i, (p, s) in enumerate(jobs)))
        stats = dict(b.stats)
        await b.aclose()
        return [(g.token_ids, g.logprobs, g.finish_reason) for pair in out for g in pair], stats

    ref, ref_stats = await run(False)
    got, stats = await run(True)
    firsts = ref[::2]  # each job's first generation (its second, the resumed turn, follows it)
    assert [r[2] for r in firsts[:5]] == ["length", "length", "stop", "length", "length"]
    assert firsts[2][0] == [first] and len(firsts[3][0]) == 1 and len(firsts[4][0]) == 1
    assert stats["prefills"] > 2 and stats["reused_tokens"] > 0
    for (ids_a, lp_a, fin_a), (ids_b, lp_b, fin_b) in zip(ref, got, strict=True):
        assert ids_a == ids_b and fin_a == fin_b
        assert lp_a == pytest.approx(lp_b, abs=1e-5)


def test_padded_prefill_rows_and_queries_leave_the_real_rows_alone(model, tokenizer):
    """What a prefill graph's buckets add (rows on slot 0's scratch column, queries left-padded with
    the scratch column, a wider span) changes neither the real rows' logits and keys nor any column
    of slot 0 that a row reads."""
    b = HFSlotBackend(model, tokenizer, max_batch_size=8, max_context=128)
    cache = b.runner.inputs()
    scratch = b.max_context
    a, c = prompts(tokenizer)[0][:10], prompts(tokenizer)[1][:6]
    with torch.inference_mode():
        for layer in range(len(cache.keys)):
            cache.keys[layer][0].fill_(7.0)

        def pass_(rows: int, width: int, span: int):
            ids = torch.full((rows, width), b.pad_id)
            cols = torch.full((rows, width), scratch)
            for j, f in enumerate((a, c)):
                ids[j, width - len(f) :] = torch.tensor(f)
                cols[j, width - len(f) :] = torch.arange(len(f))
            slots = torch.tensor([1, 3] + [0] * (rows - 2))
            return b.runner.prefill_logits(ids, cols, slots, span)[:2].clone()

        exact = pass_(2, 10, 10)
        kv = [cache.keys[0][s, :, :10].clone() for s in (1, 3)]
        padded = pass_(4, 16, 64)
    assert torch.allclose(exact, padded, atol=1e-5)
    assert all(torch.allclose(x, cache.keys[0][s, :, :10]) for x, s in zip(kv, (1, 3), strict=True))
    assert all(bool((cache.keys[layer][0, :, :scratch] == 7.0).all()) for layer in range(len(cache.keys)))


@pytest.mark.parametrize("filtered", [False, True])
def test_pick_samples_the_distribution_from_seeded_draws(filtered):
    probs = torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.0625, 0.0])
    n = 20000
    logits = probs.clamp(min=1e-30).log().expand(n, 6).contiguous()
    logits[:, 5] = float("-inf")
    u = torch.tensor([seeded_uniform(s, 0) for s in range(n)])
    ones, no = torch.ones(n), torch.zeros(n, dtype=torch.bool)
    top_k = torch.full((n,), 6 if filtered else 0, dtype=torch.long)
    tok, lp = pick(logits, ones, no, top_k, ones, u, filtered)
    counts = torch.bincount(tok, minlength=6).double()
    assert counts[5] == 0  # a token of probability 0 is never drawn
    expected = probs.double() * n
    chi2 = float((((counts - expected) ** 2) / expected.clamp(min=1e-9))[:5].sum())
    assert chi2 < 20.5  # 4 degrees of freedom, p = 0.0004
    assert torch.allclose(lp, probs.log()[tok], atol=1e-5)  # raw logprobs of the drawn tokens
    # greedy rows take the argmax; temperature sharpens; top-k 1 and a tiny top-p leave the top token
    tok, _ = pick(logits[:4], ones[:4], torch.ones(4, dtype=torch.bool), top_k[:4], ones[:4], u[:4], filtered)
    assert tok.tolist() == [0] * 4
    cold, _ = pick(logits, ones * 0.05, no, top_k, ones, u, filtered)
    assert (cold == 0).float().mean() > 0.99
    one = torch.ones(n, dtype=torch.long)
    assert pick(logits, ones, no, one, ones, u, True)[0].eq(0).all()
    assert pick(logits, ones, no, top_k * 0, ones * 0.01, u, True)[0].eq(0).all()
    top2 = pick(logits, ones, no, one * 2, ones, u, True)[0]
    assert set(top2.tolist()) == {0, 1} and abs(float(top2.eq(0).double().mean()) - 2 / 3) < 0.02


async def test_context_limits(model, tokenizer):
    small = HFSlotBackend(model, tokenizer, max_batch_size=2, max_context=32)
    with pytest.raises(BackendError, match="does not fit the backend's context of 32"):
        await small.generate(list(range(5, 38)), GREEDY)  # 33 tokens
    gen = await small.generate(list(range(5, 25)), GREEDY.replace(max_tokens=50))  # 20 + 50 > 32
    assert gen.finish_reason == "length" and len(gen.token_ids) == 32 - 20 + 1
    # the pending last token needs no column: a prompt of exactly the context gets one token
    full = await small.generate(list(range(5, 37)), GREEDY.replace(max_tokens=5))
    assert len(full.token_ids) == 1 and full.finish_reason == "length"
    assert (await small.generate([5, 6, 7], GREEDY)).token_ids  # still serving
    await small.aclose()


def test_update_weights_changes_generations_in_place(model, tokenizer):
    import copy

    own = copy.deepcopy(model)
    backend = HFSlotBackend(own, tokenizer, max_batch_size=2, max_context=128)
    p = prompts(tokenizer)[0]
    before = backend.generate_batch([p], [GREEDY])[0]
    buffer = backend.kv.cache.keys[0]  # noqa: SLF001 - the slots survive the update
    state = {k: v * 3.0 if k.endswith("mlp.down_proj.weight") else v for k, v in own.state_dict().items()}
    backend.update_weights(state)
    after = backend.generate_batch([p], [GREEDY])[0]
    assert after.logprobs != before.logprobs and backend.weights_version == 1
    assert backend.kv.cache.keys[0] is buffer  # noqa: SLF001


async def test_a_caller_that_gives_up_frees_its_slot(model, tokenizer):
    import time

    one = HFSlotBackend(model, tokenizer, max_batch_size=1, max_context=512)
    long = SamplingParams(max_tokens=400, temperature=0.0, stop_token_ids=(-1,))
    # every pass embeds its ids first: 3 ms a pass makes the 400 tokens take over a second, however fast the CPU
    slow = model.model.embed_tokens.register_forward_hook(lambda *_: time.sleep(0.003))
    try:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(one.generate([5, 6, 7], long), 0.3)
    finally:
        slow.remove()
    gen = await asyncio.wait_for(one.generate([5, 6, 7], GREEDY), 30)  # the only slot came free
    assert len(gen.token_ids) == GREEDY.max_tokens
    await one.aclose()


def test_models_and_settings_it_refuses(model, tokenizer, tiny_dir):
    import copy

    sliding = copy.deepcopy(model)
    sliding.config.layer_types = ["sliding_attention"] * sliding.config.num_hidden_layers
    with pytest.raises(ValueError, match="full-attention decoder.*sliding_attention.*use HFBackend"):
        HFSlotBackend(sliding, tokenizer)
    limit = model.config.max_position_embeddings
    with pytest.raises(ValueError, match=f"max_context must be in \\[1, {limit}\\]"):
        HFSlotBackend(model, tokenizer, max_context=limit + 1)
    with pytest.raises(ValueError, match="cuda_graphs needs the model on a CUDA device"):
        HFSlotBackend(model, tokenizer, cuda_graphs=True)
    with pytest.raises(ValueError, match="decode_block must be a power of two"):
        HFSlotBackend(model, tokenizer, decode_block=3)
    assert HFSlotBackend(model, tokenizer, max_context=64).precapture() == 0  # no graphs on CPU


def test_the_engine_registry(model, tokenizer):
    assert resolve_hf_engine("auto", device="cpu") == "continuous"
    assert resolve_hf_engine("auto", device="cuda:0") == "slots"
    assert resolve_hf_engine("auto", model=model) == "continuous"  # the model is on the CPU
    assert hf_backend_class("slots") is HFSlotBackend and hf_backend_class("continuous") is HFBackend
    with pytest.raises(ValueError, match="unknown HF engine 'paged'; choose from auto, continuous, slots"):
        resolve_hf_engine("paged")
    made = make_hf_backend(model, tokenizer, engine="slots", max_context=96, max_batch_size=3)
    assert isinstance(made, HFSlotBackend) and made.max_context == 96 and made.max_batch_size == 3
    plain = make_hf_backend(model, tokenizer, engine="auto", max_context=96)  # ignored by continuous
    assert type(plain) is HFBackend


def test_kv_memory_is_what_the_doc_says(model, tokenizer):
    backend = HFSlotBackend(model, tokenizer, max_batch_size=4, max_context=100)
    backend.generate_batch([[5, 6, 7]], [GREEDY.replace(max_tokens=2)])
    cfg = model.config
    keys = backend.kv.cache.keys  # noqa: SLF001
    assert len(keys) == cfg.num_hidden_layers
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    assert tuple(keys[0].shape) == (4, cfg.num_key_value_heads, 101, head_dim)


async def test_free_buffers_between_rollouts(model, tokenizer):
    backend = HFSlotBackend(model, tokenizer, max_batch_size=2, max_context=64)
    first = await backend.generate([5, 6, 7], GREEDY)
    with pytest.raises(RuntimeError, match="aclose\\(\\) it first"):
        backend.free_buffers()
    await backend.aclose()
    backend.free_buffers()
    assert backend.kv.cache is None  # noqa: SLF001
    again = await backend.generate([5, 6, 7], GREEDY)  # made again on the next pass
    assert again.token_ids == first.token_ids and backend.kv.cache is not None  # noqa: SLF001
    await backend.aclose()


def test_slots_too_large_for_the_device_fall_back_to_continuous_under_auto(
    model, tokenizer, monkeypatch, caplog
):
    from turngym.agents.hf import slots as hf_slots
    from turngym.agents.hf.kv.slots import kv_cache_bytes
    from turngym.agents.hf.slots import KVSlotsTooLarge

    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 4  # fp32
    assert kv_cache_bytes(model, 4, 100) == 4 * 100 * per_token
    monkeypatch.setattr(hf_slots, "free_device_bytes", lambda device: 2 * per_token * 4 * 65 - 1)
    with pytest.raises(KVSlotsTooLarge, match=r"take .* GiB, over 50% of the device's free"):
        HFSlotBackend(model, tokenizer, max_batch_size=4, max_context=64)  # 4 x 65 columns: just over half
    assert HFSlotBackend(model, tokenizer, max_batch_size=4, max_context=63).kv_bytes == 4 * 64 * per_token
    # auto (here: told the model is on CUDA) falls back to the continuous engine, with a warning
    fallback = make_hf_backend(
        model, tokenizer, engine="auto", device="cuda:0", max_context=64, max_batch_size=4
    )
    assert type(fallback) is HFBackend and fallback.model is model
    assert "using the continuous engine" in caplog.text
    with pytest.raises(KVSlotsTooLarge):  # asked for by name: the error stands
        make_hf_backend(model, tokenizer, engine="slots", max_context=64, max_batch_size=4)
