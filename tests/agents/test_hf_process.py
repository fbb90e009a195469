"""HFProcessBackend: the HF backend in a spawned worker process. Same generations as in-process,
prefix reuse across turns, cancellation, bad input, weight updates, and a worker that dies or
cannot load its model give clear errors, never a hang."""

import asyncio

import pytest

from turngym.agents import BackendError, LLMAgent, SamplingParams
from turngym.agents.hf import HFBackend, HFProcessBackend
from turngym.rollout import RolloutConfig, RolloutEngine

pytestmark = pytest.mark.slow  # each backend spawns a process that imports torch and loads the model

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=(-1,))


@pytest.fixture(scope="module")
def inproc(tiny_dir, tokenizer):
    return HFBackend(tiny_dir, tokenizer, max_batch_size=8, max_wait_ms=5)


def prompts(tokenizer):
    texts = ["Evaluate: (3 + 4) * 2", "hello world " * 5, "The number is 42 and the city is far " * 2]
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


@pytest.mark.parametrize("engine", ["continuous", "slots"])
async def test_rows_that_finish_together_come_back_in_one_message(tiny_dir, tokenizer, engine):
    # a long gathering window: the six requests join one batch, and all end at the same decode step
    backend = HFProcessBackend(
        tiny_dir, tokenizer, max_batch_size=8, max_wait_ms=1000, engine=engine, max_context=256
    )
    try:
        assert backend.frozen_objects > 10_000  # the worker froze its loaded heap (turngym.core.heap)
        ps = [p[: 4 + i] for i, p in enumerate(prompts(tokenizer) * 2)]
        gens = await asyncio.gather(*(backend.generate(p, GREEDY, route=f"t{i}") for i, p in enumerate(ps)))
        assert [len(g.token_ids) for g in gens] == [12] * 6
        assert backend.result_messages == 1
        # a refusal (outside the scheduler thread) is answered at once, on its own
        with pytest.raises(BackendError, match="outside the vocabulary"):
            await backend.generate([10**9], GREEDY)
        assert backend.result_messages == 2
        # and a lone request after them
        one = await backend.generate(ps[0], GREEDY)
        assert one.token_ids == gens[0].token_ids and backend.result_messages == 3
    finally:
        await backend.aclose()


@pytest.mark.parametrize("engine", ["continuous", "slots"])
async def test_same_generations_as_in_process_with_prefix_reuse(tiny_dir, tokenizer, inproc, engine):
    backend = HFProcessBackend(
        tiny_dir, tokenizer, max_batch_size=8, max_wait_ms=5, engine=engine, max_context=1024
    )
    try:
        ps = prompts(tokenizer)
        first = await asyncio.gather(*(backend.generate(p, GREEDY, route=f"t{i}") for i, p in enumerate(ps)))
        ref = inproc.generate_batch(ps, [GREEDY] * len(ps))
        for a, b in zip(first, ref, strict=True):
            assert a.token_ids == b.token_ids and a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        # the second turn extends each context: the worker reuses the parked rows' KV
        nxt = [p + g.token_ids + [5, 6, 7] for p, g in zip(ps, first, strict=True)]
        second = await asyncio.gather(
            *(backend.generate(p, GREEDY, route=f"t{i}") for i, p in enumerate(nxt))
        )
        ref2 = inproc.generate_batch(nxt, [GREEDY] * len(nxt))
        assert [g.token_ids for g in second] == [g.token_ids for g in ref2]
        stats = backend.stats
        assert stats["reused_tokens"] == sum(len(p) + 11 for p in ps)  # prompt + 11 of the 12 generated
        assert ("eager_decodes" in stats) == (engine == "slots")  # the worker runs the engine asked for
        assert backend.precapture() == 0  # forwarded to the worker: no CUDA graphs on CPU, either engine
        assert backend.device == "cpu" and backend.vocab_size == inproc.vocab_size
        # a fork of t0 (a tree's branch) starts from a copy of t0's row in the worker
        backend.share_prefix("t0", "f0")
        fork = nxt[0] + second[0].token_ids + [8, 9]
        got = await backend.generate(fork, GREEDY, route="f0")
        assert got.token_ids == inproc.generate_batch([fork], [GREEDY])[0].token_ids
        assert backend.stats["shared_rows"] == 1
    finally:
        await backend.aclose()


async def test_cancel_bad_input_weights_and_a_dead_worker(tiny_dir, tokenizer, inproc):
    backend = HFProcessBackend(tiny_dir, max_batch_size=4)  # tokenizer loaded from the model path
    p = prompts(tokenizer)[0]
    try:
        endless = SamplingParams(max_tokens=100_000, temperature=1.0, stop_token_ids=(-1,))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(backend.generate(p, endless), 0.3)
        await asyncio.sleep(0.2)
        steps = backend.stats["steps"]
        await asyncio.sleep(0.3)
        assert backend.stats["steps"] == steps  # the abandoned row was retired in the worker
        with pytest.raises(BackendError, match="outside the vocabulary"):
            await backend.generate([10**7], GREEDY)
        with pytest.raises(BackendError, match="empty prompt"):
            await backend.generate([], GREEDY)
        before = await backend.generate(p, GREEDY)  # the worker survived
        state = {
            k: v * 3.0 if k.endswith("mlp.down_proj.weight") else v
            for k, v in inproc.model.state_dict().items()
        }
        backend.update_weights(state)
        assert backend.weights_version == 1
        after = await backend.generate(p, GREEDY)
        assert after.logprobs != before.logprobs
        # the worker dies mid-request: the caller gets an error naming the exit, so does every later call
        task = asyncio.create_task(backend.generate(p, endless))
        await asyncio.sleep(0.2)
        backend._proc.kill()
        with pytest.raises(BackendError, match="exited"):
            await asyncio.wait_for(task, 30)
        with pytest.raises(BackendError, match="exited"):
            await backend.generate(p, GREEDY)
        with pytest.raises(BackendError, match="exited"):
            backend.stats  # noqa: B018
    finally:
        await backend.aclose()


def test_a_model_that_cannot_load_is_a_clear_error(tmp_path):
    with pytest.raises(BackendError, match="failed to load") as err:
        HFProcessBackend(tmp_path / "no-such-model", device="cpu")
    assert "no-such-model" in str(err.value)
    with pytest.raises(TypeError, match="path or hub id"):
        HFProcessBackend(object())


async def test_engine_rollouts_match_in_process(tiny_dir, tokenizer, inproc):
    sampling = SamplingParams(max_tokens=24, temperature=0.0)
    cfg = RolloutConfig(group_size=2)
    worker = HFProcessBackend(tiny_dir, tokenizer, max_batch_size=8, max_wait_ms=5)
    try:
        agent = LLMAgent(worker, tokenizer, sampling)
        trajs = await RolloutEngine("arith", agent, cfg, env_kwargs={"max_turns": 3}).run(3)
    finally:
        await worker.aclose()
    ref = await RolloutEngine(
        "arith", LLMAgent(inproc, tokenizer, sampling), cfg, env_kwargs={"max_turns": 3}
    ).run(3)
    assert not any(t.masked for t in trajs)
    for a, b in zip(trajs, ref, strict=True):
        assert a.token_ids == b.token_ids and a.loss_mask == b.loss_mask
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
