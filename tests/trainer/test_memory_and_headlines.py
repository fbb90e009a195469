"""What lets several real-model runs share one GPU, and what keeps their headlines honest.

Chunked output-head log-probs (equal values and gradients), gradient checkpointing that is really on
during updates (transformers checkpoints only in train mode; the trainer keeps dropout off), the
per-process memory cap, and eval headlines that count masked trajectories as failures.
"""

import pytest
import torch

from turngym.rollout.commands import summarize
from turngym.trainer.batching import token_logprobs, train_mode_without_dropout
from turngym.trainer.metrics import breakdown_metrics, reward_metrics
from turngym.trainer.policy import cap_gpu_memory

from .helpers import make_traj


@pytest.fixture(scope="module")
def tiny_model(tiny_dir):
    from turngym.agents.models import load_model

    return load_model(tiny_dir, device="cpu")


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 900, (3, 37), generator=g)
    attn = torch.ones_like(ids)
    attn[1, 25:] = 0  # a padded row
    return ids, attn


@pytest.mark.parametrize("chunk", [1, 7, 64, 10_000])
def test_chunked_logprobs_equal_the_full_ones_with_gradients(tiny_model, chunk):
    ids, attn = _batch()
    full, ent_full = token_logprobs(tiny_model, ids, attn, with_entropy=True)
    part, ent_part = token_logprobs(tiny_model, ids, attn, with_entropy=True, chunk_tokens=chunk)
    assert part.shape == full.shape == ids.shape and (part[:, 0] == 0).all()
    torch.testing.assert_close(part, full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent_part, ent_full, atol=1e-4, rtol=1e-4)
    weights = torch.rand(ids.shape, generator=torch.Generator().manual_seed(1))
    grads = []
    for c in (None, chunk):
        tiny_model.zero_grad(set_to_none=True)
        logp, ent = token_logprobs(tiny_model, ids, attn, with_entropy=True, chunk_tokens=c)
        ((logp + 0.1 * ent) * weights).sum().backward()
        grads.append([p.grad.clone() for p in tiny_model.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)
    tiny_model.zero_grad(set_to_none=True)


def test_updates_checkpoint_gradients_without_dropout(tiny_dir, monkeypatch):
    import transformers.modeling_layers as ml
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(tiny_dir)
    cfg.attention_dropout = 0.5  # a model that would drop attention weights in train mode
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    model.gradient_checkpointing_enable()
    seen = []
    orig = ml.GradientCheckpointingLayer.__call__

    def spy(self, *a, **k):
        seen.append(self.gradient_checkpointing and self.training)
        return orig(self, *a, **k)

    monkeypatch.setattr(ml.GradientCheckpointingLayer, "__call__", spy)
    ids, attn = _batch()
    evaluated, _ = token_logprobs(model, ids, attn)
    assert seen and not any(seen)  # eval mode: transformers skips checkpointing
    seen.clear()
    with train_mode_without_dropout(model):
        trained, _ = token_logprobs(model, ids, attn, chunk_tokens=16)
        trained.sum().backward()
        assert model.training
    assert seen and all(seen) and not model.training
    torch.testing.assert_close(trained.detach(), evaluated, atol=1e-5, rtol=1e-5)  # no dropout
    rates = {m.attention_dropout for m in model.modules() if hasattr(m, "attention_dropout")}
    assert rates == {0.5}  # restored
    model.train()
    dropped, _ = token_logprobs(model, ids, attn)
    assert not torch.allclose(dropped.detach(), evaluated)  # the rate does act in plain train mode


def test_the_memory_cap_names_a_device_index(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, i: calls.append((f, i)))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert cap_gpu_memory(0.2, "cuda") == 3  # a bare "cuda" is the current device, never index None
    assert cap_gpu_memory(0.3, "cuda:1") == 1
    assert cap_gpu_memory(0.3, "cpu") is None
    assert calls == [(0.2, 3), (0.3, 1)]


def test_headlines_count_masked_trajectories_as_failures():
    live = [make_traj([0.0, 1.0]), make_traj([0.0, 0.5])]
    masked = [make_traj([1.0], masked=True) for _ in range(6)]  # e.g. CUDA out of memory in the rollout
    m = reward_metrics(live + masked)
    assert m["reward/masked_frac"] == 0.75
    assert m["reward/outcome"] == pytest.approx(1.5 / 8)  # not 0.75, the mean of the two survivors
    assert m["reward/outcome_unmasked"] == pytest.approx(0.75)
    assert m["reward/success"] == pytest.approx(1 / 8)
    # every headline divides by all 8 (issue 41): total, terminated, turns and invalid actions too
    live_total = sum(t.total_reward for t in live)
    assert m["reward/total"] == pytest.approx(live_total / 8)
    assert m["reward/total_unmasked"] == pytest.approx(live_total / 2)
    assert m["reward/terminated"] == pytest.approx(sum(t.terminated for t in live) / 8)
    assert m["reward/terminated_unmasked"] == pytest.approx(sum(t.terminated for t in live) / 2)
    assert m["episode/turns"] == pytest.approx((2 + 2 + 6 * 1) / 8)
    assert m["episode/turns_unmasked"] == pytest.approx(2.0)
    all_masked = reward_metrics(masked)
    assert all_masked["reward/outcome"] == 0.0 and "reward/outcome_unmasked" not in all_masked
    report = summarize(live + masked, threshold=1.0)
    assert report["episodes"] == 8 and report["masked"] == 6 and report["masked_frac"] == 0.75
    assert report["success_rate"] == pytest.approx(1 / 8)
    assert report["success_ci"][0] <= 1 / 8 <= report["success_ci"][1]


def test_eval_breakdown_splits_the_headline_by_a_reference_key():
    """Per hop count: a policy that stops after two searches scores 1.0 on 2-hop and 0 on 3-hop
    questions, which the overall 0.5 hides."""
    two = [make_traj([0.0, 0.0, 1.0], reference={"answer": "a", "hops": 2}) for _ in range(3)]
    three = [make_traj([0.0, 0.0, 0.0], reference={"answer": "b", "hops": 3}) for _ in range(2)]
    three.append(make_traj([1.0], reference={"answer": "b", "hops": 3}, masked=True))
    other = [make_traj([0.5], reference={"answer": "c"})]
    m = breakdown_metrics(two + three + other, "hops", "eval/")
    assert m["eval/by_hops/2/reward/outcome"] == 1.0 and m["eval/by_hops/2/frac"] == pytest.approx(3 / 7)
    assert m["eval/by_hops/3/reward/outcome"] == 0.0  # the masked one counts as a failure
    assert m["eval/by_hops/3/reward/masked_frac"] == pytest.approx(1 / 3)
    assert m["eval/by_hops/2/episode/turns"] == 3.0
    assert m["eval/by_hops/none/reward/outcome"] == 0.5
    assert sum(v for k, v in m.items() if k.endswith("/frac") and "masked" not in k) == pytest.approx(1.0)


def test_reward_components_are_summed_per_trajectory_and_averaged_over_all_trajectories():
    """travel's per-constraint checks and a stepwise critic, side by side: which one moves."""
    a = make_traj(
        [0.0, 0.0, 1.0], components=[{"tool_ok": 1.0}, {"tool_ok": 0.5}, {"pass": 1.0, "hard.budget": 1.0}]
    )
    b = make_traj([0.0, 0.0], components=[{"tool_ok": 1.0}, {"pass": 0.0, "hard.budget": 0.0}])
    c = make_traj([0.0], components=[{"tool_ok": 1.0}])  # never submitted: no pass, no hard.budget
    gone = make_traj([1.0], components=[{"tool_ok": 9.0, "pass": 1.0}], masked=True)
    m = reward_metrics([a, b, c, gone])
    # the masked one counts as 0 (a failure), not as missing: divided by 4, not by the 3 survivors
    assert m["reward/component/tool_ok"] == pytest.approx((1.5 + 1.0 + 1.0) / 4)
    assert m["reward/component/pass"] == pytest.approx(1 / 4)
    assert m["reward/component/hard.budget"] == pytest.approx(1 / 4)
    assert not [k for k in reward_metrics([make_traj([1.0])]) if k.startswith("reward/component/")]
