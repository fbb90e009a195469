"""The slots engine's ``share_prefix``: a forked route's first request starts from a device copy of
its donor's slot row and must give exactly what a full prefill gives; the donor's row is untouched;
a missing or stale donor, or a prompt that does not extend it, is a full prefill; more forks than
slots queue; a tree rollout through the engine copies rows and feeds fewer prompt tokens."""

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turngym.agents import LLMAgent, SamplingParams
from turngym.agents.hf import HFSlotBackend
from turngym.rollout import RolloutConfig, RolloutEngine
from turngym.rollout.tree import TreeConfig

TURN = SamplingParams(max_tokens=8, temperature=0.0, stop_token_ids=(-1,))
LONG = SamplingParams(max_tokens=40, temperature=0.0, stop_token_ids=(-1,))


@pytest.fixture(scope="module")
def model(tiny_dir):
    from turngym.agents.models import load_model

    return load_model(tiny_dir)


def slot_backend(model, tokenizer, **kw):
    kw = {"max_batch_size": 8, "max_wait_ms": 20, "max_context": 512, "park_s": 600.0, **kw}
    return HFSlotBackend(model, tokenizer, **kw)


@pytest.fixture
def on(model, tokenizer):
    return slot_backend(model, tokenizer)


@pytest.fixture
def off(model, tokenizer):
    """The reference: every prompt prefilled from scratch."""
    return slot_backend(model, tokenizer, reuse_prefix=False)


def enc(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def same(a, b):
    assert a.token_ids == b.token_ids
    assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


async def first_turn(on, tokenizer, route="p"):
    """The donor's first turn (parked after it) and the context its forks continue from."""
    prompt = enc(tokenizer, "Evaluate: (3 + 4) * 2 and then some more words")
    gen = await on.generate(prompt, TURN, route=route)
    return prompt, gen, prompt + gen.token_ids + enc(tokenizer, " obs: 17")


async def test_forks_copy_the_parked_row_and_the_donor_goes_on_unchanged(on, off, tokenizer):
    prompt, gen, context = await first_turn(on, tokenizer)
    on.share_prefix("p", "c1")
    on.share_prefix("p", "c2")
    fed0 = on.stats["prompt_tokens"]
    # the donor's next turn and its two forks arrive together (a branch point); the forks sample
    # with their own seeds
    hot = [TURN, TURN.replace(temperature=1.0, seed=11), TURN.replace(temperature=1.0, seed=12)]
    routes = ("p", "c1", "c2")
    got = await asyncio.gather(*(on.generate(context, s, route=r) for r, s in zip(routes, hot, strict=True)))
    want = [await off.generate(context, s) for s in hot]
    for g, w in zip(got, want, strict=True):
        same(g, w)
    assert got[1].token_ids != got[2].token_ids  # the siblings diverge, each on its own seed
    assert on.stats["shared_rows"] == 2
    # each fed only what the parked row lacked: its last sampled token and the observation
    new = len(context) - len(prompt) - len(gen.token_ids) + 1
    assert on.stats["prompt_tokens"] - fed0 == 3 * new
    # the donor's row was not touched by the copies: its next turn resumes it and gives the ids of
    # a full prefill; so does a fork's next turn on its own row
    for route, g in (("p", got[0]), ("c1", got[1])):
        nxt = context + g.token_ids + enc(tokenizer, " next")
        reused = on.stats["reused_tokens"]
        same(await on.generate(nxt, TURN, route=route), await off.generate(nxt, TURN))
        assert on.stats["reused_tokens"] - reused == len(context) + len(g.token_ids) - 1
    assert on.stats["shared_rows"] == 2
    assert off.stats["shared_rows"] == off.stats["reused_tokens"] == 0
    await on.aclose()
    await off.aclose()


async def test_a_fork_copies_a_running_donor_which_is_unchanged(on, off, tokenizer):
    prompt = enc(tokenizer, "hello world " * 6)
    steps = on.stats["steps"]
    running = asyncio.ensure_future(on.generate(prompt, LONG, route="p"))
    while on.stats["steps"] < steps + 3:  # the donor is decoding
        await asyncio.sleep(0.001)
    on.share_prefix("p", "c")
    fork = prompt + enc(tokenizer, " a different ending")
    same(await on.generate(fork, TURN, route="c"), await off.generate(fork, TURN))
    donor = await running
    same(donor, await off.generate(prompt, LONG))
    assert on.stats["shared_rows"] == 1
    # the common prefix (the prompt, and any of the donor's first tokens the fork repeats) was copied
    assert on.stats["reused_tokens"] == common_prefix(prompt + donor.token_ids, fork) >= len(prompt)
    await on.aclose()
    await off.aclose()


async def test_forks_arriving_with_their_donors_first_request_copy_its_fresh_row(on, off, tokenizer):
    """A tree branching at its first turn: the donor has no row yet when its first request and its
    forks' arrive together. The donor is prefilled first, then each fork starts from a copy of that
    row and feeds one token; a fork whose prompt extends the donor's feeds only its own tail."""
    prompt = enc(tokenizer, "Evaluate: (3 + 4) * 2 and then some more words")
    longer = prompt + enc(tokenizer, " and a longer one")
    for r in ("c1", "c2", "c3"):
        on.share_prefix("p", r)
    asks = [
        ("p", prompt, TURN),
        ("c1", prompt, TURN.replace(temperature=1.0, seed=1)),
        ("c2", prompt, TURN.replace(temperature=1.0, seed=2)),
        ("c3", longer, TURN),
    ]
    got = await asyncio.gather(*(on.generate(x, s, route=r) for r, x, s in asks))
    for g, (_, x, s) in zip(got, asks, strict=True):
        same(g, await off.generate(x, s))
    assert on.stats["shared_rows"] == 3
    # the donor's prompt; one token each for the forks with its prompt; c3's own tail
    assert on.stats["prompt_tokens"] == len(prompt) + 2 + (len(longer) - len(prompt))
    assert on.stats["reused_tokens"] == 2 * (len(prompt) - 1) + len(prompt)
    await on.aclose()
    await off.aclose()


@pytest.mark.parametrize("gone", ["release", "reset_prefix_cache", "update_weights", "expired"])
async def test_a_donor_row_that_is_gone_gives_a_full_prefill(gone, model, off, tokenizer):
    on = slot_backend(model, tokenizer, park_s=0.05 if gone == "expired" else 600.0)
    _, _, context = await first_turn(on, tokenizer)
    on.share_prefix("p", "c")
    if gone == "release":
        on.release("p")
    elif gone == "reset_prefix_cache":
        on.reset_prefix_cache()
    elif gone == "update_weights":
        on.update_weights(model.state_dict())  # the same values, a new version
    else:
        await asyncio.sleep(0.2)
    fed = on.stats["prompt_tokens"]
    same(await on.generate(context, TURN, route="c"), await off.generate(context, TURN))
    assert on.stats["shared_rows"] == 0 and on.stats["prompt_tokens"] - fed == len(context)
    await on.aclose()
    await off.aclose()


async def test_a_prompt_that_does_not_extend_the_donor(on, off, tokenizer):
    prompt, gen, _ = await first_turn(on, tokenizer)
    # nothing in common: a full prefill
    other = enc(tokenizer, "<tool_call> something else entirely")
    assert other[0] != prompt[0]
    on.share_prefix("p", "a")
    fed = on.stats["prompt_tokens"]
    same(await on.generate(other, TURN, route="a"), await off.generate(other, TURN))
    assert on.stats["shared_rows"] == 0 and on.stats["prompt_tokens"] - fed == len(other)
    # diverging half-way: only the common prefix is copied, the rest fed
    half = prompt[: len(prompt) // 2] + enc(tokenizer, " and now for something different")
    on.share_prefix("p", "b")
    reused = on.stats["reused_tokens"]
    same(await on.generate(half, TURN, route="b"), await off.generate(half, TURN))
    assert on.stats["shared_rows"] == 1
    assert on.stats["reused_tokens"] - reused == common_prefix(prompt + gen.token_ids[:-1], half)
    # a fork whose donor never generated (no such row): a full prefill
    on.share_prefix("nobody", "d")
    same(await on.generate(half, TURN, route="d"), await off.generate(half, TURN))
    assert on.stats["shared_rows"] == 1
    await on.aclose()
    await off.aclose()


async def test_more_forks_than_slots_queue_without_corruption(model, off, tokenizer):
    on = slot_backend(model, tokenizer, max_batch_size=3)
    _, _, context = await first_turn(on, tokenizer)
    routes = [f"c{i}" for i in range(7)]
    for r in routes:
        on.share_prefix("p", r)
    samplings = [TURN.replace(temperature=1.0, seed=100 + i, max_tokens=6 + 3 * i) for i in range(7)]
    got = await asyncio.gather(
        on.generate(context, LONG, route="p"),
        *(on.generate(context, s, route=r) for r, s in zip(routes, samplings, strict=True)),
    )
    same(got[0], await off.generate(context, LONG))
    for g, s in zip(got[1:], samplings, strict=True):
        same(g, await off.generate(context, s))
    assert 1 <= on.stats["shared_rows"] <= len(routes)
    assert max(on.stats["widths"]) <= 3
    await on.aclose()
    await off.aclose()


async def test_forks_that_evict_each_others_donors_read_the_donors_before_any_copy(model, off, tokenizer):
    """Three slots: donors p (older) and q parked, one free. A plain request takes the free slot,
    q's fork evicts p's row and p's fork evicts q's: each fork must still get its own donor's KV."""
    on = slot_backend(model, tokenizer, max_batch_size=3)
    p_prompt, q_prompt = enc(tokenizer, "hello world " * 4), enc(tokenizer, "The number is 42 " * 3)
    p = await on.generate(p_prompt, TURN, route="p")
    q = await on.generate(q_prompt, TURN, route="q")
    on.share_prefix("q", "cq")
    on.share_prefix("p", "cp")
    tail = enc(tokenizer, " then more")
    asks = [
        (enc(tokenizer, "<tool_call> plain"), None),
        (q_prompt + q.token_ids + tail, "cq"),
        (p_prompt + p.token_ids + tail, "cp"),
    ]
    got = await asyncio.gather(*(on.generate(x, TURN, route=r) for x, r in asks))
    for g, (x, _) in zip(got, asks, strict=True):
        same(g, await off.generate(x, TURN))
    assert on.stats["shared_rows"] == 2 and on.stats["parked_dropped"] == 2
    await on.aclose()
    await off.aclose()


@settings(max_examples=8, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    keep=st.integers(min_value=0, max_value=30),
    tail=st.lists(st.integers(min_value=3, max_value=1000), min_size=1, max_size=12),
    donor_tokens=st.integers(min_value=1, max_value=10),
)
def test_property_a_copied_prefix_gives_the_ids_of_a_full_prefill(model, tokenizer, keep, tail, donor_tokens):
    """Whatever part of the donor's ids a fork's prompt keeps (all, some, none of its prompt and
    generation) before its own tokens, the fork's greedy ids and logprobs are a full prefill's."""

    async def run():
        on, off = slot_backend(model, tokenizer), slot_backend(model, tokenizer, reuse_prefix=False)
        prompt = enc(tokenizer, "The number is 42 and the city is far")
        gen = await on.generate(prompt, TURN.replace(max_tokens=donor_tokens), route="p")
        held = prompt + gen.token_ids
        on.share_prefix("p", "c")
        fork = held[: min(keep, len(held))] + tail
        same(await on.generate(fork, TURN, route="c"), await off.generate(fork, TURN))
        await on.aclose()
        await off.aclose()
        return on.stats

    stats = asyncio.run(run())
    assert stats["shared_rows"] <= 1


async def test_a_tree_rollout_copies_rows_and_feeds_fewer_prompt_tokens(model, tokenizer):
    """The same trees (same seeds) on the slots engine with and without ``share_prefix``."""

    async def tree(share: bool):
        backend = slot_backend(model, tokenizer, max_batch_size=16, max_context=2048)
        if not share:
            backend.share_prefix = None  # LLMSession.fork then leaves every branch to a full prefill
        agent = LLMAgent(backend, tokenizer, SamplingParams(max_tokens=8), max_context=2048)
        cfg = RolloutConfig(tree=TreeConfig(k=2, turns=(0, 1)), max_concurrency=8)
        engine = RolloutEngine("arith", agent, cfg, env_kwargs={"max_turns": 3})
        leaves = await engine.run([0, 1])
        await backend.aclose()
        return leaves, engine.stats, backend.stats

    shared, shared_engine, with_share = await tree(True)
    full, _, without = await tree(False)
    assert shared_engine.masked == 0 and len(shared) == len(full) > 2
    # the same trees: sharing changes where the KV comes from, not what is sampled
    assert [leaf.token_ids for leaf in shared] == [leaf.token_ids for leaf in full]
    assert with_share["shared_rows"] > 0 and without["shared_rows"] == 0
    assert with_share["prompt_tokens"] < without["prompt_tokens"]
    assert shared_engine.tree["reused_prefix_tokens"] > 0
