"""HF backend prefix reuse: a finished row with a route stays parked with its KV cache, and the
route's next request (its prompt extending the parked ids) feeds only the new tokens. Results must
equal a full prefill; stale, expired, evicted and diverging rows must never be reused wrongly."""

import asyncio

import pytest

from tests.agents import hf_turns
from turngym.agents import LLMAgent, SamplingParams
from turngym.agents.hf import HFBackend
from turngym.rollout import RolloutConfig, RolloutEngine

TURN = SamplingParams(max_tokens=10, temperature=0.0, stop_token_ids=(-1,))


@pytest.fixture
def backends(tiny_dir, tokenizer):
    """(with reuse, without reuse) over the same model object."""
    # parked rows must not expire between turns on a loaded CI machine (expiry has its own test)
    on = HFBackend(tiny_dir, tokenizer, max_batch_size=8, max_wait_ms=5, park_s=600.0)
    off = HFBackend(on.model, tokenizer, max_batch_size=8, max_wait_ms=5, reuse_prefix=False)
    return on, off  # each test closes both in its own event loop


def first_prompts(tokenizer, n=3):
    texts = ["Evaluate: (3 + 4) * 2", "hello world " * 6, "The number is 42 and the city is far " * 2]
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts[:n]]


async def three_turns(backend, prompt, route, obs):
    """Generate, then extend the context by the generation and an observation, twice more."""
    return await hf_turns.three_turns(backend, prompt, route, obs, TURN)


async def test_resumed_turns_equal_full_prefills(backends, tokenizer):
    on, off = backends
    obs = tokenizer.encode(" observation: 17", add_special_tokens=False)
    ps = first_prompts(tokenizer)
    reused = await asyncio.gather(*(three_turns(on, p, f"r{i}", obs) for i, p in enumerate(ps)))
    full = await asyncio.gather(*(three_turns(off, p, f"r{i}", obs) for i, p in enumerate(ps)))
    for a_turns, b_turns in zip(reused, full, strict=True):
        for a, b in zip(a_turns, b_turns, strict=True):
            assert a.token_ids == b.token_ids
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    # turns 2 and 3 fed only what the parked row lacked: the last sampled token and the observation
    assert on.stats["reused_tokens"] > 0 and off.stats["reused_tokens"] == 0
    assert on.stats["prompt_tokens"] == sum(map(len, ps)) + 2 * len(ps) * (1 + len(obs))
    assert on.stats["prompt_tokens"] + on.stats["reused_tokens"] == off.stats["prompt_tokens"]
    await on.aclose()
    await off.aclose()


async def test_a_diverging_prompt_reuses_only_the_common_prefix(backends, tokenizer):
    on, off = backends
    p = first_prompts(tokenizer)[1]
    gen = await on.generate(p, TURN, route="t")
    # the next prompt rewrites the last part of the history: only the shared head may be reused
    edited = p[:-3] + tokenizer.encode(" rewritten", add_special_tokens=False) + gen.token_ids[:4]
    a = await on.generate(edited, TURN, route="t")
    b = await off.generate(edited, TURN, route="t")
    assert a.token_ids == b.token_ids
    assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    assert on.stats["reused_tokens"] == len(p) - 3
    # a prompt that shares nothing is prefilled in full (the parked row is dropped, not reused)
    other = tokenizer.encode("<tool_call>", add_special_tokens=False)
    before = on.stats["reused_tokens"]
    c = await on.generate(other, TURN, route="t")
    assert c.token_ids == (await off.generate(other, TURN, route="t")).token_ids
    assert on.stats["reused_tokens"] == before
    await on.aclose()
    await off.aclose()


async def test_stale_rows_are_never_reused(backends, tokenizer):
    on, off = backends
    p = first_prompts(tokenizer)[0]
    gen = await on.generate(p, TURN, route="w")
    nxt = p + gen.token_ids
    # new weights: the parked row's KV was computed with the old ones
    state = {
        k: v * 1.5 if k.endswith("mlp.down_proj.weight") else v for k, v in on.model.state_dict().items()
    }
    on.update_weights(state)
    after = await on.generate(nxt, TURN, route="w")
    assert on.stats["reused_tokens"] == 0
    assert after.token_ids == (await off.generate(nxt, TURN)).token_ids  # same model object: new weights
    # reset_prefix_cache drops parked rows too
    await on.generate(nxt + after.token_ids, TURN, route="w")
    reused = on.stats["reused_tokens"]
    assert reused > 0
    on.reset_prefix_cache()
    await on.generate(nxt + after.token_ids + [5], TURN, route="w")
    assert on.stats["reused_tokens"] == reused
    await on.aclose()
    await off.aclose()


async def test_parked_rows_expire_and_make_room(tiny_dir, tokenizer):
    backend = HFBackend(tiny_dir, tokenizer, max_batch_size=2, max_wait_ms=1, park_s=2.0)
    p = first_prompts(tokenizer)[0]
    gens = await asyncio.gather(*(backend.generate(p, TURN, route=f"x{i}") for i in range(2)))
    dropped = backend.stats["parked_dropped"]
    # a third route needs a row: the oldest parked row makes room, the other one is still reusable
    await backend.generate(p, TURN, route="x2")
    assert backend.stats["parked_dropped"] == dropped + 1 and backend.stats["parked_evicted"] == 1
    await backend.generate(p + gens[1].token_ids, TURN, route="x1")
    assert backend.stats["reused_tokens"] > 0
    # an idle scheduler drops rows parked longer than park_s
    await asyncio.sleep(2.3)
    reused = backend.stats["reused_tokens"]
    await backend.generate(p + gens[0].token_ids, TURN, route="x2")
    assert backend.stats["reused_tokens"] == reused
    assert backend.stats["parked_dropped"] >= dropped + 3
    assert backend.stats["parked_evicted"] == 1  # expiry is a drop, not an eviction
    await backend.aclose()


async def test_engine_rollouts_reuse_prefixes_with_identical_results(tiny_dir, tokenizer):
    """Through the engine and the chat template: greedy trajectories are the same with and without
    reuse, and every turn after the first reuses its trajectory's context."""
    results = {}
    for reuse in (True, False):
        backend = HFBackend(tiny_dir, tokenizer, max_batch_size=16, max_wait_ms=5, reuse_prefix=reuse)
        agent = LLMAgent(backend, tokenizer, SamplingParams(max_tokens=24, temperature=0.0))
        engine = RolloutEngine("arith", agent, RolloutConfig(group_size=2), env_kwargs={"max_turns": 3})
        trajs = await engine.run(4)
        stats = dict(backend.stats)
        await backend.generate([5, 6], SamplingParams(max_tokens=1))  # one more scheduler iteration
        # each trajectory released its route when it ended: its last row was dropped, none is left
        assert backend.stats["parked_dropped"] == (8 if reuse else 0)
        assert backend.stats["parked_evicted"] == 0  # 16 rows for 8 trajectories: ends are releases
        results[reuse] = (trajs, stats)
        await backend.aclose()
    (on, on_stats), (off, off_stats) = results[True], results[False]
    assert [t.masked for t in on] == [False] * 8
    for a, b in zip(on, off, strict=True):
        assert a.token_ids == b.token_ids and a.loss_mask == b.loss_mask
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    assert on_stats["reused_tokens"] > 0
    assert on_stats["prompt_tokens"] + on_stats["reused_tokens"] == off_stats["prompt_tokens"]


@pytest.mark.parametrize("fuse_tokens", [0, 100_000])
async def test_a_new_route_joins_a_batch_of_only_parked_rows(tiny_dir, tokenizer, fuse_tokens):
    """Regression: with fusing on (the CUDA default), a fresh request arriving while every row in the
    batch was parked was dropped unanswered, and its caller waited forever."""
    backend = HFBackend(tiny_dir, tokenizer, max_batch_size=8, max_wait_ms=1, fuse_tokens=fuse_tokens)
    a, b, c = first_prompts(tokenizer)
    first = await backend.generate(a, TURN, route="a")
    assert backend.stats["parked_dropped"] == 0  # route a's row is parked, nothing else is live
    second = await asyncio.wait_for(backend.generate(b, TURN, route="b"), 30)
    # and a resumed route alongside a fresh one, again into a batch of parked rows only
    gens = await asyncio.wait_for(
        asyncio.gather(backend.generate(a + first.token_ids, TURN, route="a"), backend.generate(c, TURN)), 30
    )
    assert [len(g.token_ids) for g in (first, second, *gens)] == [TURN.max_tokens] * 4
    assert backend.stats["reused_tokens"] > 0
    await backend.aclose()
