"""One card, two phases, on CPU with the tiny model: ``rollout.sleep_during_update`` puts the kept
slots engine to sleep for every update (its KV slots gone while the update runs) and wakes it for
the next rollout, which samples what a run without sleeping samples; ``memory.*_fraction`` refuses an
over-budget setting with its numbers; the settings that cannot work together are refused."""

import json

import pytest

from turngym.trainer.config import load_config
from turngym.trainer.distributed import DistContext
from turngym.trainer.loop import Trainer
from turngym.trainer.memory_budget import MemoryBudgetError, check_memory_budget, phase_bytes
from turngym.trainer.metrics import read_metrics

BASE = [
    "rollout.env=arith",
    "rollout.env_kwargs={depth: 1, max_turns: 2}",
    "rollout.tasks_per_step=2",
    "rollout.group_size=2",
    "rollout.max_tokens=12",
    "rollout.max_context=2048",
    "rollout.backend.hf_engine=slots",
    "optim.lr=1e-3",
    "log.progress=false",
    "log.tensorboard=false",
]


def config(tmp_path, name, *extra):
    return load_config(None, [f"run_dir={tmp_path / name}", *BASE, *extra])


def _tokens(run, step):
    lines = (run / "trajectories" / f"step-{step:06d}.jsonl").read_text().splitlines()
    return [json.loads(line)["token_ids"] for line in lines]


def test_the_engine_sleeps_through_every_update_and_samples_as_a_kept_awake_one(tmp_path, monkeypatch):
    from turngym.trainer import update

    seen = []
    real = update.policy_update

    def during_update(policy, cfg, *a, **kw):  # what the kept engine holds while the update runs
        backend = trainer.orchestrator.kept_backend
        seen.append((backend, backend.asleep, backend.kv.arena, backend.kv.cache))
        return real(policy, cfg, *a, **kw)

    monkeypatch.setattr(update, "policy_update", during_update)
    trainer = Trainer(config(tmp_path, "sleep", "steps=2", "rollout.sleep_during_update=true"))
    trainer.train()
    backend = seen[0][0]
    assert [s[1:] for s in seen] == [("kv+graphs", None, None)] * 2  # asleep, no KV, both updates
    assert all(s[0] is backend for s in seen)  # one engine for the whole run
    assert backend.stats["sleeps"] == 2 and backend.stats["wakes"] == 1  # woken for step 2's rollout
    rows = read_metrics(tmp_path / "sleep")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["time/sleep"] >= 0 and r["time/wake"] >= 0
        assert abs(r["update/ratio_mean"] - 1.0) < 1e-3  # the woken engine's logprobs are the policy's
    monkeypatch.setattr(update, "policy_update", real)
    Trainer(config(tmp_path, "awake", "steps=2", "rollout.keep_backend=true")).train()
    for step in (1, 2):  # sleeping changed nothing the rollouts sampled
        assert _tokens(tmp_path / "sleep", step) == _tokens(tmp_path / "awake", step)


@pytest.fixture(scope="module")
def policy():
    from turngym.trainer.policy import Policy

    cfg = load_config(None, [*BASE, "rollout.backend.max_batch_size=8", "rollout.max_context=512"])
    return Policy(cfg, DistContext())


def test_an_over_budget_setting_is_refused_with_its_numbers(policy):
    model = policy.model
    c = model.config
    head_dim = c.hidden_size // c.num_attention_heads
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    kv = 2 * c.num_hidden_layers * 8 * c.num_key_value_heads * 513 * head_dim * 4  # fp32 slots
    overrides = [*BASE, "rollout.backend.max_batch_size=8", "rollout.max_context=512"]
    b = phase_bytes(load_config(None, overrides), policy, card_bytes=10**9)
    assert (b.weights, b.grads, b.optimizer, b.kv) == (weights, weights, 2 * weights, kv)  # fp32 AdamW
    card = 2 * (b.update - kv // 2)  # the update fits half of it only without the KV slots

    awake = load_config(None, [*overrides, "memory.update_fraction=0.5"])
    with pytest.raises(MemoryBudgetError) as e:
        check_memory_budget(awake, policy, card_bytes=card)
    said = str(e.value)
    assert "the update phase needs" in said and "memory.update_fraction = 0.5" in said
    for number in (card, weights, 2 * weights, kv, b.weights + b.grads + b.optimizer + kv):
        assert f"{number:,} B" in said, number  # card, weights and gradients, state, KV, the phase
    assert "rollout phase" not in said  # only the phase over its share is named
    assert "rollout.sleep_during_update: true" in said and "optim.optimizer: adamw_8bit" in said

    asleep = load_config(None, [*overrides, "memory.update_fraction=0.5", "rollout.sleep_during_update=true"])
    assert check_memory_budget(asleep, policy, card_bytes=card).update == b.update - kv  # fits now
    tight = load_config(None, [*overrides, "memory.rollout_fraction=0.1"])
    with pytest.raises(
        MemoryBudgetError, match=r"the rollout phase needs .* over memory.rollout_fraction = 0.1"
    ):
        check_memory_budget(tight, policy, card_bytes=card)
    assert check_memory_budget(load_config(None, overrides), policy, card_bytes=card) is None  # unset
    assert check_memory_budget(tight, policy) is None  # CPU: no card size to hold it to


def test_settings_that_cannot_work_together_are_refused():
    with pytest.raises(ValueError, match="sleep_level kv\\+graphs"):
        load_config(
            None,
            [
                "rollout.sleep_during_update=true",
                "rollout.sleep_level=kv",
                "cluster.strategy=fsdp",
                "cluster.fsdp.release_full_copy=true",
            ],
        )
    with pytest.raises(ValueError, match="rollouts run on vLLM servers"):
        load_config(
            None,
            [
                "rollout.sleep_during_update=true",
                "weight_sync=vllm_full",
                "rollout.backend={kind: vllm, urls: ['http://127.0.0.1:1']}",
            ],
        )
    with pytest.raises(ValueError, match="checkpoint_async .* needs cluster.strategy=fsdp"):
        load_config(None, ["checkpoint_async=true"])
    with pytest.raises(ValueError, match="less than or equal to 1"):
        load_config(None, ["memory.update_fraction=1.5"])


def test_sleep_is_refused_on_cuda_before_the_model_loads(tmp_path):
    """On an H200 the engine's tokens after sleep() and wake() differed from before: a run asking for
    the sleep on CUDA stops at setup with the reason, before any weights are loaded."""
    from turngym.trainer.loop import Trainer

    cfg = load_config(
        None,
        [
            f"run_dir={tmp_path}",
            "model.path=/nonexistent/model",  # never read: the check comes first
            "model.device=cuda",
            "rollout.sleep_during_update=true",
        ],
    )
    with pytest.raises(
        ValueError, match="refused on CUDA: .* greedy tokens after sleep\\(\\) and wake\\(\\)"
    ):
        Trainer(cfg).setup()


def test_the_update_counts_fsdps_unsharded_gradients_between_micro_batches(policy, monkeypatch):
    """Under FSDP a step's micro-batches accumulate the whole model's gradient unsharded, in the reduce
    dtype, unless each micro-batch is reduced at once (measured at 7B on 2 H200s: 28.4 GiB more)."""
    overrides = [
        *BASE,
        "rollout.backend.max_batch_size=8",
        "rollout.max_context=512",
        "cluster.strategy=fsdp",
    ]
    plain = phase_bytes(load_config(None, overrides), policy, card_bytes=10**9)
    monkeypatch.setattr(policy, "sharded", True)  # this one-process policy's tensors stand for a rank's
    n = sum(p.numel() for p in policy.params())
    accumulating = phase_bytes(load_config(None, overrides), policy, card_bytes=10**9)
    assert accumulating.grads == plain.grads + 4 * n  # fp32 reduce dtype
    bf16 = phase_bytes(load_config(None, [*overrides, "cluster.fsdp.reduce_dtype=bfloat16"]), policy, 10**9)
    assert bf16.grads == plain.grads + 2 * n
    every = load_config(None, [*overrides, "cluster.fsdp.reduce_every_micro_batch=true"])
    assert phase_bytes(every, policy, card_bytes=10**9).grads == plain.grads
    with pytest.raises(MemoryBudgetError, match="cluster.fsdp.reduce_every_micro_batch: true"):
        check_memory_budget(load_config(None, [*overrides, "memory.update_fraction=0.01"]), policy, 10**9)
