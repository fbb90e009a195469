"""The RL loop end to end on CPU with the tiny model: metrics, checkpoints, exact resume, LoRA + KL, SFT."""

import json

import pytest

from turngym.trainer.config import load_config
from turngym.trainer.judges import ProgrammaticJudge
from turngym.trainer.loop import Trainer
from turngym.trainer.metrics import read_metrics

BASE = [
    "rollout.env=arith",
    "rollout.env_kwargs={depth: 1, max_turns: 2}",
    "rollout.tasks_per_step=2",
    "rollout.group_size=2",
    "rollout.max_tokens=12",
    "optim.lr=1e-3",
    "log.progress=false",
]


def config(tmp_path, name, *extra):
    return load_config(None, [f"run_dir={tmp_path / name}", *BASE, *extra])


def test_end_to_end_metrics_checkpoint_and_artifacts(tmp_path):
    summary = Trainer(config(tmp_path, "run", "steps=2", "checkpoint_every=1", "keep_checkpoints=1")).train()
    run = tmp_path / "run"
    assert summary["step"] == 2
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:  # outcome and total reward are logged separately
        assert {"reward/outcome", "reward/total", "update/loss", "update/grad_norm", "time/rollout"} <= set(r)
        assert abs(r["update/ratio_mean"] - 1.0) < 1e-3  # training logprobs reproduce the sampling ones
        # the rollout time ledger: summed per phase, the top-level shares add up to one
        assert r["rollout/time/generate"] > 0 and r["rollout/time/generate/decode"] > 0
        shares = [v for k, v in r.items() if k.startswith("rollout/time_share/")]
        assert len(shares) == 6 and abs(sum(shares) - 1.0) < 1e-6 and r["rollout/trajectories_per_hour"] > 0
        # the rollout backend's own counters, this rollout's (a backend is made per rollout)
        assert r["rollout/backend/prefills"] >= 1 and r["rollout/backend/steps"] > 0
        assert r["rollout/backend/prompt_tokens"] > 0 and "rollout/backend/widths" not in r
        # the update's model FLOP rate from the tokens it ran; per-phase peaks only on CUDA
        trajs = [
            json.loads(x)
            for x in (run / "trajectories" / f"step-{r['step']:06d}.jsonl").read_text().splitlines()
        ]
        assert r["throughput/update_tokens"] == sum(len(t["token_ids"]) for t in trajs if not t["masked"]) > 0
        assert r["throughput/update_tflops"] > 0 and not any(k.startswith("memory/") for k in r)
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-000002"]
    assert (run / "final" / "config.json").exists() and (run / "tb").is_dir()
    trajs = (run / "trajectories" / "step-000001.jsonl").read_text().splitlines()
    assert len(trajs) == 4 and json.loads(trajs[0])["token_ids"]
    assert json.loads(trajs[0])["turns"][0]["timing"]["generate"] > 0  # each turn keeps its ledger


def shorter_is_better(a, b):
    """A programmatic arena judge that gives a random model non-zero advantages (and so real updates)."""
    la, lb = sum(len(t.action.content) for t in a.turns), sum(len(t.action.content) for t in b.turns)
    return float(la < lb), float(lb < la)


def test_interrupted_and_resumed_run_matches_an_uninterrupted_one(tmp_path):
    steps = ["steps=3", "checkpoint_every=1", "credit.method=arena", "credit.arena.workers=1"]
    judge = ProgrammaticJudge(shorter_is_better)
    Trainer(config(tmp_path, "full", *steps), judge=judge).train()
    first = Trainer(config(tmp_path, "split", *steps), judge=judge)
    first.train(max_steps=1)  # interrupted after one step
    second = Trainer(config(tmp_path, "split", *steps), judge=judge)
    summary = second.train()
    assert summary["resumed"] and summary["step"] == 3
    full, split = read_metrics(tmp_path / "full"), read_metrics(tmp_path / "split")
    keys = [
        "reward/outcome",
        "rollout/generated_tokens",
        "credit/adv_abs_mean",
        "update/loss",
        "update/grad_norm",
    ]
    flat = lambda rows: [r[k] for r in rows for k in keys]  # noqa: E731
    assert all(r["update/grad_norm"] > 0 for r in full)  # the policy really changed between steps
    assert flat(split) == pytest.approx(flat(full), rel=1e-4, abs=1e-7)


def test_lora_with_kl_to_the_base_model(tmp_path):
    cfg = config(
        tmp_path,
        "lora",
        "steps=1",
        "model.lora={r: 4, alpha: 8}",
        "loss.kl_coef=0.01",
        "loss.entropy_coef=0.001",
    )
    trainer = Trainer(cfg)
    trainer.setup()
    trainable = [n for n, p in trainer.policy.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    trainer.train()
    row = read_metrics(tmp_path / "lora")[-1]
    assert row["update/kl"] == pytest.approx(0.0, abs=1e-6)  # first step: adapter starts at zero
    assert "update/entropy" in row
    assert (tmp_path / "lora" / "final" / "adapter_config.json").exists()


def test_sft_warm_start_learns_the_expert_format(tmp_path):
    from turngym.agents.models import load_tokenizer
    from turngym.trainer.sft import expert_sequences, expert_trajectories, tokenize_trajectory

    tok = load_tokenizer("tiny")
    trajs = expert_trajectories("arith", range(3), {"depth": 1})
    seq = tokenize_trajectory(trajs[0], tok)
    masked = [t for t, m in zip(seq.token_ids, seq.loss_mask, strict=True) if m]
    text = tok.decode(masked)
    # loss only on the assistant's actions (+ their stop tokens), never on the prompt or tool results
    assert (
        text.count("<tool_call>") == len(trajs[0].turns)
        and "Evaluate" not in text
        and "tool_response" not in text
    )
    cfg = config(tmp_path, "sft", "steps=1", "sft.steps=30", "sft.tasks=8", "sft.batch_size=4", "sft.lr=3e-3")
    trainer = Trainer(cfg)
    trainer.train()
    info = json.loads((tmp_path / "sft" / "sft_done.json").read_text())
    assert info["sft/loss_last"] < 0.5 * info["sft/loss_first"]
    assert expert_sequences  # the public helper exists for the CLI


def test_sft_env_kwargs_configure_the_demonstrations_env_not_the_rl_env(tmp_path, monkeypatch):
    """``sft.env_kwargs`` merge over ``rollout.env_kwargs`` for the expert only: an expert that always
    double-checks needs 3 turns, so with RL's 2-turn budget it has no successful demonstration."""
    from turngym.trainer import sft

    asked = []
    real = sft.expert_trajectories

    def spy(env, seeds, env_kwargs=None):
        asked.append(dict(env_kwargs or {}))
        return real(env, seeds, env_kwargs)

    monkeypatch.setattr(sft, "expert_trajectories", spy)
    extra = ("steps=1", "sft.steps=2", "sft.tasks=4", "sft.batch_size=2", "sft.eval_before=false")
    cfg = config(tmp_path, "demo", *extra, "sft.env_kwargs={max_turns: 3, expert_recheck: 1.0}")
    assert cfg.sft_env_kwargs() == {"depth": 1, "max_turns": 3, "expert_recheck": 1.0}
    assert cfg.rollout.env_kwargs == {"depth": 1, "max_turns": 2}
    Trainer(cfg).train()
    assert asked == [{"depth": 1, "max_turns": 3, "expert_recheck": 1.0}]
    info = json.loads((tmp_path / "demo" / "sft_done.json").read_text())
    assert info["sft/sequences"] == 4  # every double-checking episode succeeded within 3 turns
    # the RL rollouts ran with the 2-turn budget: no episode got a third turn
    assert read_metrics(tmp_path / "demo")[-1]["episode/turns"] <= 2
    with pytest.raises(ValueError, match="no expert sequences"):  # the same expert under RL's budget
        Trainer(config(tmp_path, "rl", *extra, "sft.env_kwargs={expert_recheck: 1.0}")).train()


def test_bf16_autocast_runs_sft_and_the_update_in_bf16_and_keeps_fp32_weights(tmp_path, monkeypatch):
    import torch

    from turngym.trainer import batching

    seen = []
    real = batching.token_logprobs

    def spy(model, *a, **kw):  # what a forward pass of the update and the warm start computes in
        seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None)
        return real(model, *a, **kw)

    monkeypatch.setattr(batching, "token_logprobs", spy)
    cfg = config(
        tmp_path, "bf16", "steps=2", "sft.steps=20", "sft.tasks=8", "sft.batch_size=4", "sft.lr=3e-3"
    )
    cfg.model.autocast = "bfloat16"
    trainer = Trainer(cfg)
    trainer.train()
    assert seen and set(seen) == {torch.bfloat16}
    assert {p.dtype for p in trainer.policy.model.parameters()} == {torch.float32}
    info = json.loads((tmp_path / "bf16" / "sft_done.json").read_text())
    assert info["sft/loss_last"] < 0.7 * info["sft/loss_first"]
    assert [r["step"] for r in read_metrics(tmp_path / "bf16") if "update/grad_norm" in r] == [1, 2]
    with pytest.raises(ValueError, match="autocast"):
        config(tmp_path, "fp16", "model.autocast=float16")
    with pytest.raises(ValueError, match="bfloat16"):
        batching.mixed_precision(trainer.policy.model, "float16")


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_the_slots_engine_serves_the_rollouts_and_frees_its_slots_for_the_update(tmp_path, monkeypatch, lora):
    from turngym.agents.hf import HFSlotBackend

    freed = []
    free = HFSlotBackend.free_buffers
    monkeypatch.setattr(HFSlotBackend, "free_buffers", lambda self: (freed.append(self), free(self)))
    extra = ["model.lora={r: 4, alpha: 8}"] if lora else []
    Trainer(
        config(
            tmp_path,
            "slots",
            "steps=2",
            "rollout.backend.hf_engine=slots",
            "rollout.max_context=2048",
            *extra,
        )
    ).train()
    rows = read_metrics(tmp_path / "slots")
    assert [r["step"] for r in rows] == [1, 2]
    assert len(freed) == 2 and all(b.kv.cache is None and b.stats["eager_decodes"] > 0 for b in freed)
    for r in rows:  # the slots engine's raw logprobs are the ones the update recomputes
        assert abs(r["update/ratio_mean"] - 1.0) < 1e-3
        assert r["rollout/time/generate/decode"] > 0


def test_the_run_seed_reaches_every_sampling_seed(tmp_path, monkeypatch):
    from turngym.rollout import engine as engine_mod

    seen = []
    real = engine_mod.RolloutEngine.__init__

    def spy(self, env, agent, config=None, **kw):
        seen.append(config.sampling_seed)
        real(self, env, agent, config, **kw)

    monkeypatch.setattr(engine_mod.RolloutEngine, "__init__", spy)
    Trainer(config(tmp_path, "s5", "steps=1", "seed=5", "rollout.eval_tasks=2")).train()
    assert seen and set(seen) == {5}  # the training step and the evals


@pytest.mark.parametrize("mode", ["max", "min"])
def test_keep_best_exports_the_policy_of_the_best_eval(tmp_path, mode):
    import torch
    from transformers import AutoModelForCausalLM

    metric = "eval/judge/win_rate"  # against the start policy: it moves as the arena updates the policy
    cfg = config(
        tmp_path,
        mode,
        "steps=4",
        "rollout.eval_tasks=4",
        "rollout.eval_every=1",
        "rollout.eval_judge=true",
        "credit.method=arena",
        "credit.arena.workers=1",
        f"keep_best={{metric: {metric}, mode: {mode}}}",
    )
    trainer = Trainer(cfg, judge=ProgrammaticJudge(shorter_is_better))
    trainer.setup()
    snapshot = lambda: {k: v.detach().clone() for k, v in trainer.policy.model.state_dict().items()}  # noqa: E731
    weights = {0: snapshot()}
    trainer.train(on_step=lambda step, _: weights.__setitem__(step, snapshot()))
    rows = read_metrics(tmp_path / mode)
    evals = [(r["step"], r[metric]) for r in rows if metric in r]
    assert [s for s, _ in evals] == [0, 1, 2, 3, 4]
    pick = max if mode == "max" else min
    want = pick(v for _, v in evals)
    step = next(s for s, v in evals if v == want)  # the first eval that reached it: later ties keep it
    if mode == "min":
        assert step > 0  # this run replaces the start policy's export with a later one
    record = json.loads((tmp_path / mode / "best" / "best.json").read_text())
    assert record["step"] == step and record["value"] == pytest.approx(want) and record["metric"] == metric
    best = AutoModelForCausalLM.from_pretrained(tmp_path / mode / "best").state_dict()
    for k, v in weights[step].items():
        assert torch.equal(best[k], v), k
    assert not list((tmp_path / mode).glob(".tmp-*")) and not list((tmp_path / mode).glob(".old-*"))


def test_keep_best_rejects_a_metric_the_eval_does_not_log_before_any_rl_step(tmp_path):
    cfg = config(
        tmp_path,
        "typo",
        "steps=2",
        "rollout.eval_tasks=2",
        "rollout.eval_every=1",
        "keep_best={metric: eval/reward/sucess}",
    )
    with pytest.raises(
        ValueError, match=r"keep_best.metric 'eval/reward/sucess' is not an eval metric.*eval/reward/success"
    ):
        Trainer(cfg).train()
    assert [r["step"] for r in read_metrics(tmp_path / "typo")] == [0]  # only the start policy's eval
    with pytest.raises(ValueError, match="must be an eval metric"):
        config(
            tmp_path,
            "x",
            "rollout.eval_tasks=2",
            "rollout.eval_every=1",
            "keep_best={metric: reward/outcome}",
        )
    with pytest.raises(ValueError, match="keep_best needs a held-out eval"):
        config(tmp_path, "y", "keep_best={metric: eval/reward/outcome}")


def test_train_command_names_the_kept_best_policy(tmp_path):
    from typer.testing import CliRunner

    from turngym.cli import app

    run = tmp_path / "cli"
    args = ["train", f"run_dir={run}", *BASE, "steps=1", "rollout.eval_tasks=2", "rollout.eval_every=1"]
    res = CliRunner().invoke(app, [*args, "keep_best={metric: eval/reward/outcome}"])
    assert res.exit_code == 0, res.output
    record = json.loads((run / "best" / "best.json").read_text())
    assert f"best eval/reward/outcome {record['value']:.3f} at step {record['step']}" in res.output
    assert str(run / "best") in res.output.replace("\n", "")


def test_a_kept_backend_trains_like_one_made_per_rollout(tmp_path):
    """``rollout.keep_backend``: one slots backend serves every rollout (training and eval) of the
    run, with the weights each update wrote (the fast forward's fused copies refreshed, parked rows
    dropped), and gives the metrics of a backend made per rollout; its counters are per rollout."""
    steps = [
        "steps=3",
        "rollout.eval_every=1",
        "rollout.eval_tasks=2",
        "rollout.backend.hf_engine=slots",
        "credit.method=arena",
        "credit.arena.workers=1",
    ]
    judge = ProgrammaticJudge(shorter_is_better)
    Trainer(config(tmp_path, "fresh", *steps), judge=judge).train()
    kept = Trainer(config(tmp_path, "kept", *steps, "rollout.keep_backend=true"), judge=judge)
    seen = []
    kept.train(on_step=lambda step, row: seen.append(kept.orchestrator.kept_backend))
    assert seen[0] is not None and all(b is seen[0] for b in seen)
    assert kept.orchestrator.kept_backend is None  # released at the end
    rows = {name: read_metrics(tmp_path / name) for name in ("fresh", "kept")}
    evals = {
        name: [r["eval/reward/outcome"] for r in v if "eval/reward/outcome" in r] for name, v in rows.items()
    }
    assert len(evals["fresh"]) == 4 and evals["kept"] == pytest.approx(evals["fresh"], abs=1e-7)
    fresh, again = ([r for r in rows[name] if "update/loss" in r] for name in ("fresh", "kept"))
    keys = ["reward/outcome", "rollout/generated_tokens", "update/loss"]
    flat = lambda rows: [r[k] for r in rows for k in keys]  # noqa: E731
    assert len(fresh) == 3 and all(r["update/grad_norm"] > 0 for r in fresh)  # the weights moved
    assert flat(again) == pytest.approx(flat(fresh), rel=1e-4, abs=1e-7)
    for a, b in zip(fresh, again, strict=True):  # this rollout's passes, not a running total
        assert a["rollout/backend/prefills"] == b["rollout/backend/prefills"] > 0
        assert a["rollout/backend/prompt_tokens"] == b["rollout/backend/prompt_tokens"]


def test_prefix_reuse_is_logged_and_evictions_warned_once(tmp_path, caplog):
    """``rollout/prefix_reuse`` (prompt tokens served from parked rows) each step; with more
    trajectories at once than the backend has rows, parked rows are evicted, reuse falls, and the
    run says why, once."""
    import logging

    roomy = Trainer(
        config(tmp_path, "roomy", "steps=1", "rollout.max_concurrency=4", "rollout.backend.max_batch_size=4")
    )
    with caplog.at_level(logging.WARNING, logger="turngym.trainer"):
        roomy.train()
    assert "parked rows were evicted" not in caplog.text
    tight = Trainer(
        config(tmp_path, "tight", "steps=2", "rollout.max_concurrency=4", "rollout.backend.max_batch_size=1")
    )
    with caplog.at_level(logging.WARNING, logger="turngym.trainer"):
        tight.train()
    assert caplog.text.count("parked rows were evicted") == 1
    assert "rollout.max_concurrency" in caplog.text
    rows = {name: read_metrics(tmp_path / name) for name in ("roomy", "tight")}
    assert all(0 <= r["rollout/prefix_reuse"] <= 1 for v in rows.values() for r in v)
    assert rows["tight"][0]["rollout/backend/parked_evicted"] > 0
    assert rows["roomy"][0]["rollout/backend/parked_evicted"] == 0  # a row for every trajectory
    assert rows["roomy"][0]["rollout/prefix_reuse"] > rows["tight"][0]["rollout/prefix_reuse"]


def test_rollouts_run_at_the_configured_matmul_precision(tmp_path, monkeypatch):
    """``rollout.matmul_precision`` holds while the rollout generates (the in-process backend's passes)
    and torch's own setting is back for the update; a value torch does not know is refused up front."""
    import torch

    from turngym.rollout.engine import RolloutEngine
    from turngym.trainer.batching import matmul_precision

    seen: list[str] = []
    run = RolloutEngine.run

    async def spy(self, seeds):
        seen.append(torch.get_float32_matmul_precision())
        return await run(self, seeds)

    monkeypatch.setattr(RolloutEngine, "run", spy)
    before = torch.get_float32_matmul_precision()
    Trainer(config(tmp_path, "tf32", "steps=1")).train()  # the default: TF32 for an fp32 policy's rollouts
    assert seen == ["high"] and torch.get_float32_matmul_precision() == before
    seen.clear()
    Trainer(config(tmp_path, "full", "steps=1", "rollout.matmul_precision=highest")).train()
    assert seen == ["highest"] and torch.get_float32_matmul_precision() == before
    seen.clear()
    Trainer(config(tmp_path, "own", "steps=1", "rollout.matmul_precision=null")).train()
    assert seen == [before]
    with pytest.raises(ValueError, match="matmul_precision"):
        config(tmp_path, "bad", "rollout.matmul_precision=tf32")
    with pytest.raises(RuntimeError), matmul_precision("medium"):  # restored on the way out of an error
        assert torch.get_float32_matmul_precision() == "medium"
        raise RuntimeError
    assert torch.get_float32_matmul_precision() == before
