"""Property test of the HF backends' schedulers (the continuous engine and the slots engine): any pattern of concurrent arrivals (routes resuming
their parked rows, fresh requests, callers that give up mid-generation, trajectories released,
parked rows expiring or evicted for room), with joiners fused into decode passes or prefilled
apart, answers every request that was not abandoned, and under greedy decoding with the ids the
request gets alone. A request the scheduler drops would hang its caller; here it fails the
``wait_for``."""

import asyncio
import functools

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from turngym.agents import SamplingParams
from turngym.agents.hf import HFBackend, HFSlotBackend

TURN = SamplingParams(max_tokens=4, temperature=0.0, stop_token_ids=(-1,))
ROUTES = ["a", "b", "c", "d", None]


@functools.cache
def model_and_tokenizer():
    from turngym.agents.models import load_model, load_tokenizer
    from turngym.agents.tiny import tiny_model_path

    path = tiny_model_path()
    return load_model(path), load_tokenizer(path)


# one call: (route, extend the route's context or start fresh, give up after this many seconds)
call = st.tuples(st.sampled_from(ROUTES), st.booleans(), st.sampled_from([None, None, None, 0.0, 0.004]))
# one wave: calls started a pause apart, then routes released once the wave is done
wave = st.tuples(
    st.lists(call, min_size=1, max_size=4),
    st.sampled_from([0.0, 0.003]),
    st.sets(st.sampled_from(ROUTES[:-1]), max_size=2),
)


@settings(max_examples=60, suppress_health_check=list(HealthCheck))
@given(
    waves=st.lists(wave, min_size=1, max_size=4),
    fuse=st.sampled_from([0, 100_000]),
    max_batch=st.sampled_from([2, 3, 8]),
    park_s=st.sampled_from([10.0, 0.005]),
    slots=st.booleans(),
)
def test_every_request_is_answered_with_its_unbatched_ids(waves, fuse, max_batch, park_s, slots):
    model, tok = model_and_tokenizer()
    starts = [tok.encode(f"task {i}: count the sheep", add_special_tokens=False) for i in range(8)]
    obs = tok.encode(" ok", add_special_tokens=False)
    stats: dict = {}

    async def run() -> list[tuple[list[int], list[int]]]:
        if slots:  # fuse 0: prefill passes of at most 8 tokens (a group split row by row)
            backend = HFSlotBackend(
                model,
                tok,
                max_batch_size=max_batch,
                max_wait_ms=1,
                park_s=park_s,
                max_context=256,
                prefill_tokens=8 if fuse == 0 else 16384,
            )
        else:
            backend = HFBackend(
                model, tok, max_batch_size=max_batch, max_wait_ms=1, fuse_tokens=fuse, park_s=park_s
            )
        context: dict[str, list[int]] = {}  # route -> its next prompt when it extends
        done: list[tuple[list[int], list[int]]] = []
        n = 0

        async def one(route, prompt, give_up):
            try:  # a caller may abandon it (a turn timeout, a cancelled rollout)
                gen = await asyncio.wait_for(
                    backend.generate(prompt, TURN, route=route), 15 if give_up is None else give_up
                )
            except TimeoutError:
                assert give_up is not None, "a request was never answered"
                event("a caller gave up")
                context.pop(route, None)
                return
            done.append((prompt, gen.token_ids))
            if route is not None:
                context[route] = prompt + gen.token_ids + obs

        try:
            for calls, pause, released in waves:
                tasks, used = [], set()
                for route, extend, give_up in calls:
                    if route is not None and route in used:  # one request per route at a time
                        continue
                    used.add(route)
                    prompt = context.get(route) if extend and route is not None else None
                    if prompt is None:
                        prompt, n = starts[n % len(starts)], n + 1
                    tasks.append(asyncio.create_task(one(route, prompt, give_up)))
                    await asyncio.sleep(pause)
                await asyncio.gather(*tasks)
                for route in released:
                    backend.release(route)
                    context.pop(route, None)
            # the backend still serves after all that
            done.append(
                (starts[0], (await asyncio.wait_for(backend.generate(starts[0], TURN), 15)).token_ids)
            )
        finally:
            await backend.aclose()
            stats.update(backend.stats)
        return done

    results = asyncio.run(run())
    event(f"engine: {'slots' if slots else 'continuous'}")
    event(
        f"reused prefixes: {stats['reused_tokens'] > 0}, parked rows dropped: {stats['parked_dropped'] > 0}"
    )
    reference = HFBackend(model, tok, max_batch_size=1, reuse_prefix=False)

    async def alone():
        try:
            return [(await reference.generate(p, TURN)).token_ids for p, _ in results]
        finally:
            await reference.aclose()

    assert [ids for _, ids in results] == asyncio.run(alone())
