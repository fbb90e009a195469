"""Property test of the HF backend's scheduler: any pattern of concurrent arrivals (routes resuming
their parked rows, fresh requests, rows evicted for room), with joiners fused into decode passes or
prefilled apart, answers every request, and under greedy decoding with the ids a request gets
alone. A request the scheduler drops would hang its caller; here it fails the ``wait_for``."""

import asyncio
import functools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turngym.agents import SamplingParams
from turngym.agents.hf import HFBackend

TURN = SamplingParams(max_tokens=4, temperature=0.0, stop_token_ids=(-1,))
ROUTES = ["a", "b", "c", "d", None]


@functools.cache
def model_and_tokenizer():
    from turngym.agents.models import load_model, load_tokenizer
    from turngym.agents.tiny import tiny_model_path

    path = tiny_model_path()
    return load_model(path), load_tokenizer(path)


wave = st.lists(st.tuples(st.sampled_from(ROUTES), st.booleans()), min_size=1, max_size=4)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    waves=st.lists(st.tuples(wave, st.sampled_from([0.0, 0.003])), min_size=1, max_size=4),
    fuse=st.sampled_from([0, 100_000]),
    max_batch=st.sampled_from([2, 3, 8]),
)
def test_every_request_is_answered_with_its_unbatched_ids(waves, fuse, max_batch):
    model, tok = model_and_tokenizer()
    starts = [tok.encode(f"task {i}: count the sheep", add_special_tokens=False) for i in range(8)]
    obs = tok.encode(" ok", add_special_tokens=False)

    async def run() -> list[tuple[list[int], list[int]]]:
        backend = HFBackend(model, tok, max_batch_size=max_batch, max_wait_ms=1, fuse_tokens=fuse)
        context: dict[str, list[int]] = {}  # route -> its next prompt when it extends
        done: list[tuple[list[int], list[int]]] = []
        n = 0

        async def one(route, extend, prompt):
            gen = await asyncio.wait_for(backend.generate(prompt, TURN, route=route), 15)
            done.append((prompt, gen.token_ids))
            if route is not None:
                context[route] = prompt + gen.token_ids + obs

        try:
            for calls, pause in waves:
                tasks, used = [], set()
                for route, extend in calls:
                    if route is not None and route in used:  # one request per route at a time
                        continue
                    used.add(route)
                    prompt = context.get(route) if extend and route is not None else None
                    if prompt is None:
                        prompt, n = starts[n % len(starts)], n + 1
                    tasks.append(asyncio.create_task(one(route, extend, prompt)))
                    await asyncio.sleep(pause)
                await asyncio.gather(*tasks)
        finally:
            await backend.aclose()
        return done

    results = asyncio.run(run())
    reference = HFBackend(model, tok, max_batch_size=1, reuse_prefix=False)

    async def alone():
        try:
            return [(await reference.generate(p, TURN)).token_ids for p, _ in results]
        finally:
            await reference.aclose()

    assert [ids for _, ids in results] == asyncio.run(alone())
