"""HF backend ``share_prefix``: a forked route's first request starts from a copy of its donor's row
(parked or running) and must give exactly what a full prefill gives; the donor is unchanged."""

import asyncio

import pytest

from turngym.agents import SamplingParams
from turngym.agents.hf import HFBackend

TURN = SamplingParams(max_tokens=8, temperature=0.0, stop_token_ids=(-1,))
LONG = SamplingParams(max_tokens=24, temperature=0.0, stop_token_ids=(-1,))


@pytest.fixture
def backends(tiny_dir, tokenizer):
    on = HFBackend(tiny_dir, tokenizer, max_batch_size=8, max_wait_ms=5, park_s=600.0)
    off = HFBackend(on.model, tokenizer, max_batch_size=8, max_wait_ms=5, reuse_prefix=False)
    return on, off


def same(a, b):
    assert a.token_ids == b.token_ids
    assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


async def test_siblings_copy_the_parked_row_of_their_parent(backends, tokenizer):
    on, off = backends
    prompt = tokenizer.encode("Evaluate: (3 + 4) * 2 and then some more words", add_special_tokens=False)
    gen = await on.generate(prompt, TURN, route="p")
    context = prompt + gen.token_ids + tokenizer.encode(" obs: 17", add_special_tokens=False)
    on.share_prefix("p", "c1")
    on.share_prefix("p", "c2")
    # the parent and two forks continue from the same context at once (a branch point)
    got = await asyncio.gather(*(on.generate(context, TURN, route=r) for r in ("p", "c1", "c2")))
    want = await off.generate(context, TURN, route="x")
    for g in got:
        same(g, want)
    assert on.stats["shared_rows"] == 2
    # each fed only what the parked row lacked: the last sampled token and the observation
    fed_after_first = on.stats["prompt_tokens"] - len(prompt)
    assert fed_after_first == 3 * (len(context) - len(prompt) - len(gen.token_ids) + 1)
    # a fork's next turn resumes its own row
    nxt = context + got[1].token_ids
    same(await on.generate(nxt, TURN, route="c1"), await off.generate(nxt, TURN, route="y"))
    assert on.stats["shared_rows"] == 2
    await on.aclose()
    await off.aclose()


async def test_a_fork_copies_a_running_donor_and_a_missing_donor_is_a_full_prefill(backends, tokenizer):
    on, off = backends
    prompt = tokenizer.encode("hello world " * 6, add_special_tokens=False)
    running = asyncio.ensure_future(on.generate(prompt, LONG, route="p"))
    await asyncio.sleep(0.3)  # the donor is decoding
    on.share_prefix("p", "c")
    fork = prompt + tokenizer.encode(" a different ending", add_special_tokens=False)
    a = await on.generate(fork, TURN, route="c")
    same(a, await off.generate(fork, TURN, route="x"))
    same(await running, await off.generate(prompt, LONG, route="z"))  # the donor is unchanged
    shared = on.stats["shared_rows"]
    assert shared == 1  # the fork started from a copy of the donor's row (running, or parked if it finished)
    on.share_prefix("gone", "d")  # no row of that route: the fork is prefilled in full
    same(await on.generate(fork, TURN, route="d"), await off.generate(fork, TURN, route="w"))
    assert on.stats["shared_rows"] == shared
    await on.aclose()
    await off.aclose()
