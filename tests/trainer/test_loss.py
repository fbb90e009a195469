"""PPO loss, KL estimators and aggregations on hand-computed tensors."""

import math

import pytest
import torch

from turngym.trainer.loss import LossConfig, aggregate, entropy_from_logits, kl_penalty, policy_loss

approx = pytest.approx


def lp(*ratios):
    return torch.log(torch.tensor([list(ratios)], dtype=torch.float64))


def test_ppo_clip_low_high():
    old = torch.zeros(1, 3, dtype=torch.float64)
    adv = torch.tensor([[1.0, -1.0, 2.0]], dtype=torch.float64)
    loss, stats = policy_loss(lp(1.5, 0.5, 1.0), old, adv, torch.ones(1, 3))
    # tok0: min(1.5, 1.28)=1.28; tok1: min(-0.5, -0.8)=-0.8; tok2: 2 -> pg = [-1.28, 0.8, -2]
    assert float(loss) == approx((-1.28 + 0.8 - 2.0) / 3)
    assert stats["clip_frac"] == approx(2 / 3)
    loss, _ = policy_loss(
        lp(1.5, 0.5, 1.0), old, adv, torch.ones(1, 3), LossConfig(clip_low=0.6, clip_high=0.6)
    )
    assert float(loss) == approx((-1.5 + 0.5 - 2.0) / 3)


def test_dual_clip_caps_negative_advantage_loss():
    old = torch.zeros(1, 2, dtype=torch.float64)
    adv = torch.tensor([[-1.0, 1.0]], dtype=torch.float64)
    new = lp(5.0, 5.0)
    plain, _ = policy_loss(new, old, adv, torch.ones(1, 2), LossConfig(aggregation="seq_mean_token_sum"))
    assert float(plain) == approx(5.0 - 1.28)
    dual, _ = policy_loss(
        new, old, adv, torch.ones(1, 2), LossConfig(dual_clip=3.0, aggregation="seq_mean_token_sum")
    )
    assert float(dual) == approx(3.0 - 1.28)
    with pytest.raises(ValueError):
        policy_loss(new, old, adv, torch.ones(1, 2), LossConfig(dual_clip=0.5))


def test_kl_estimators():
    logp = torch.log(torch.tensor([0.5], dtype=torch.float64))
    ref = torch.zeros(1, dtype=torch.float64)
    assert float(kl_penalty(logp, ref, "k1")) == approx(-math.log(2))
    assert float(kl_penalty(logp, ref, "k3")) == approx(2 - math.log(2) - 1)
    assert float(kl_penalty(ref, ref, "k3")) == 0.0
    with pytest.raises(ValueError):
        kl_penalty(logp, ref, "k2")


def test_kl_and_entropy_terms_enter_the_loss():
    logp = lp(0.5)
    zero = torch.zeros(1, 1, dtype=torch.float64)
    ent = torch.tensor([[0.7]], dtype=torch.float64)
    cfg = LossConfig(kl_coef=0.1, kl_type="k3", entropy_coef=0.01)
    loss, stats = policy_loss(logp, logp, zero, torch.ones(1, 1), cfg, ref_logprobs=zero, entropy=ent)
    assert float(loss) == approx(0.1 * (2 - math.log(2) - 1) - 0.01 * 0.7)
    assert stats["kl"] == approx(2 - math.log(2) - 1) and stats["entropy"] == approx(0.7)
    off, _ = policy_loss(logp, logp, zero, torch.ones(1, 1), ref_logprobs=zero, entropy=ent)
    assert float(off) == 0.0  # defaults: KL and entropy off


def test_aggregations():
    v = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    assert float(aggregate(v, m, "token_mean")) == approx(7 / 3)
    assert float(aggregate(v, m, "seq_mean_token_sum")) == approx((3 + 4) / 2)
    assert float(aggregate(v, m, "seq_mean_token_mean")) == approx((1.5 + 4) / 2)
    for mode in ("token_mean", "seq_mean_token_sum", "seq_mean_token_mean"):
        assert float(aggregate(v, torch.zeros_like(m), mode)) == 0.0
    with pytest.raises(ValueError):
        aggregate(v, m, "sum")


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"])
def test_micro_batches_add_up_to_the_full_batch(mode):
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(4, 5, generator=g, dtype=torch.float64) * 0.1
    old = torch.randn(4, 5, generator=g, dtype=torch.float64) * 0.1
    adv = torch.randn(4, 5, generator=g, dtype=torch.float64)
    mask = (torch.rand(4, 5, generator=g) > 0.3).to(torch.float64)
    cfg = LossConfig(aggregation=mode)
    full, _ = policy_loss(logp, old, adv, mask, cfg)
    n_tok, n_seq = float(mask.sum()), float((mask.sum(-1) > 0).sum())
    parts = [
        policy_loss(logp[s], old[s], adv[s], mask[s], cfg, num_tokens=n_tok, num_seqs=n_seq)[0]
        for s in (slice(0, 2), slice(2, 4))
    ]
    assert float(sum(parts)) == approx(float(full))


def test_gradient_pushes_up_positive_advantage_tokens():
    logits = torch.zeros(1, 2, 3, requires_grad=True)
    ids = torch.tensor([[0, 1]])
    logp = torch.log_softmax(logits, -1).gather(-1, ids[..., None])[..., 0]
    loss, _ = policy_loss(logp, logp.detach(), torch.tensor([[1.0, -1.0]]), torch.ones(1, 2))
    loss.backward()
    assert logits.grad[0, 0, 0] < 0 and logits.grad[0, 1, 1] > 0  # descent raises tok0, lowers tok1


def test_entropy_from_logits():
    assert float(entropy_from_logits(torch.zeros(4))) == approx(math.log(4))
    assert float(entropy_from_logits(torch.tensor([100.0, 0.0]))) == approx(0.0, abs=1e-6)
