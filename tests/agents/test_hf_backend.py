"""HF backend: dynamic batching, greedy batched == unbatched, raw logprobs, stops, weight updates."""

import asyncio

import pytest
import torch

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
    before = hf_backend.batches
    together = await asyncio.gather(*(hf_backend.generate(p, GREEDY) for p in ps))
    assert hf_backend.batches - before < len(ps)  # concurrent requests were batched
    assert max(hf_backend.batch_sizes[before:]) > 1
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
    with pytest.raises(BackendError):  # token id out of the vocabulary: the model raises inside the worker
        await hf_backend.generate([10**7], GREEDY)
    assert (await hf_backend.generate([5, 6], GREEDY)).token_ids  # the worker survives


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
