"""The RL loop: rollout -> credit -> policy update (micro-batches, gradient accumulation) -> weight
sync -> log -> checkpoint, with an optional SFT warm start and exact resume.

    trainer = Trainer(load_config("examples/configs/igpo_search_qa.yaml"))
    summary = trainer.train()

The trainer is a short loop over four roles: the :class:`~turngym.trainer.policy.Policy` (model,
optimizer, sharding, weight sync), the :class:`~turngym.trainer.orchestrator.Orchestrator` (backend,
env pool, rollouts, credit, evals), the update (:func:`~turngym.trainer.update.policy_update`) and the
:class:`~turngym.trainer.run_state.RunState` (resume, warm start, checkpoints, best and final exports).

Generation runs through the HF backend in the same process, sharing the trained module (CPU or
GPU), or through vLLM servers with LoRA adapters hot-loaded after each update. Every step's task
seeds follow from the step index (the data position) and sampling is reseeded per step, so a run
resumed from a checkpoint continues exactly like an uninterrupted one. The run's ``seed`` is mixed
into every sampling seed (``RolloutConfig.sampling_seed``): two seeds of one config see the same tasks
and sample differently.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from turngym.trainer.config import TrainConfig
from turngym.trainer.distributed import main_first, merge_metrics

#: rollout metrics that add up over ranks (the rest are averaged)
SUMMED_OVER_RANKS = (
    "rollout/masked/",
    "rollout/generated_tokens",
    "rollout/tokens_per_s",
    "rollout/time/",
    "rollout/trajectories_per_hour",
    "rollout/tree/",
    "rollout/backend/",
    "throughput/update_tokens",
)
#: metrics where the largest rank's value is the one that matters (memory must fit on every card)
MAXED_OVER_RANKS = ("memory/",)


class Trainer:
    """One training run described by a :class:`TrainConfig`: ``setup`` builds the roles (``policy``,
    ``orchestrator``, ``run``), ``train`` runs the loop, ``train_step`` one step of it."""

    def __init__(self, config: TrainConfig, judge: Callable | None = None):
        self.cfg = config
        self.run_dir = Path(config.run_dir)
        self.judge = judge
        self._setup_done = False

    @property
    def step(self) -> int:
        """Training steps done (0 before ``setup``)."""
        return self.run.step if self._setup_done else 0

    def setup(self) -> None:
        """Join the process group, load the policy and build the orchestrator and the run state."""
        import torch

        from turngym.agents.models import default_device
        from turngym.trainer.distributed import NullLogger, check_same_config, init_distributed
        from turngym.trainer.memory_budget import check_memory_budget, check_sleep_device
        from turngym.trainer.metrics import MetricLogger
        from turngym.trainer.orchestrator import Orchestrator
        from turngym.trainer.policy import Policy
        from turngym.trainer.run_state import RunState, config_hash

        cfg = self.cfg
        self.dist = init_distributed(cfg.cluster.ddp_backend, cfg.cluster.timeout_s)
        check_same_config(self.dist, config_hash(cfg))  # before anything is loaded or written
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.dist.is_main:
            (self.run_dir / "config.json").write_text(cfg.model_dump_json(indent=1))
        torch.manual_seed(cfg.seed)
        check_sleep_device(cfg, self.dist.device(cfg.model.device) or default_device())  # before loading
        self.policy = Policy(cfg, self.dist)
        check_memory_budget(cfg, self.policy)  # memory.*_fraction: refused now, with the numbers
        self.orchestrator = Orchestrator(cfg, self.policy, self.judge)
        self.logger = (
            MetricLogger(
                self.run_dir, cfg.log.tensorboard, cfg.log.wandb, cfg.log.wandb_project, cfg.model_dump()
            )
            if self.dist.is_main
            else NullLogger()
        )
        self.run = RunState(cfg, self.policy, self.logger)
        self._setup_done = True

    def train_step(self) -> dict[str, float]:
        """One step: rollout and credit, the update, the weight sync; returns the step's metrics."""
        from turngym.trainer.oom import phase_peak_gib
        from turngym.trainer.update import policy_update

        device = self.policy.device
        t0 = time.perf_counter()
        step = self.run.step
        phase_peak_gib(device)  # each phase's peak from here on
        trajs, credit, metrics = self.orchestrator.collect(step)
        rollout_peak = phase_peak_gib(device)
        slept = self.orchestrator.sleep_engine()  # rollout.sleep_during_update: the KV leaves the card
        if slept is not None:
            metrics["time/sleep"], metrics["time/wake"] = slept, self.orchestrator.wake_s
            phase_peak_gib(device)  # the update's peak starts from what the sleep left
        t2 = time.perf_counter()
        metrics.update(policy_update(self.policy, self.cfg, trajs, credit.token_advantages))
        metrics["time/update"] = time.perf_counter() - t2
        update_peak = phase_peak_gib(device)
        if update_peak is not None:
            metrics["memory/rollout_peak_gib"], metrics["memory/update_peak_gib"] = rollout_peak, update_peak
        metrics["throughput/update_tokens"] = float(sum(len(t.token_ids) for t in trajs if not t.masked))
        t3 = time.perf_counter()
        self.policy.sync_weights(step + 1)
        metrics["time/sync"] = time.perf_counter() - t3
        if self.policy.sharded:  # gathering the shards into the rollouts' full copy (part of the sync)
            metrics["time/refresh"] = self.policy.refresh_seconds
        self.run.step += 1
        metrics["time/step"] = time.perf_counter() - t0
        metrics = merge_metrics(self.dist, metrics, summed=SUMMED_OVER_RANKS, maxed=MAXED_OVER_RANKS)
        # the update's model FLOP rate over all ranks: 6 FLOPs a parameter a token (forward + backward)
        metrics["throughput/update_tflops"] = (
            6
            * self.policy.num_params
            * metrics["throughput/update_tokens"]
            / max(metrics["time/update"], 1e-9)
            / 1e12
        )
        self.orchestrator.note_reuse(metrics, self.run.step)
        if self.cfg.log.save_trajectories:
            self.run.save_trajectories(step + 1, trajs)
        return metrics

    def train(
        self, max_steps: int | None = None, on_step: Callable[[int, dict], None] | None = None
    ) -> dict[str, Any]:
        """Run until ``cfg.steps`` (or ``max_steps`` more steps, to interrupt a run on purpose)."""
        if not self._setup_done:
            self.setup()
        cfg, run, orch = self.cfg, self.run, self.orchestrator
        resumed = run.resume()
        fresh = not resumed and run.step == 0
        if fresh:
            # the untrained policy's held-out score, so a report can say what the warm start itself did
            before = orch.evaluate() if cfg.sft.steps > 0 and cfg.sft.eval_before else {}
            if cfg.sft.steps > 0:
                orch.sleep_engine()  # the eval's kept engine gives its KV back for the warm start
            with main_first(self.dist) as first:  # one warm start; the other ranks load its weights
                info = run.warm_start(first)
            info = {**{k.replace("eval/", "eval_before_sft/", 1): v for k, v in before.items()}, **info}
            if info:
                self.logger.log(0, info)
        if cfg.weight_sync != "in_process":  # servers hold the base model: push the warm-started/resumed one
            self.policy.sync_weights(run.step)
        if fresh:
            base = orch.evaluate()
            if base:
                self.logger.log(0, base)
                run.keep_best(0, base)
        stop = cfg.steps if max_steps is None else min(cfg.steps, run.step + max_steps)
        last: dict[str, float] = {}
        while run.step < stop:
            last = self.train_step()
            if cfg.rollout.eval_every and run.step % cfg.rollout.eval_every == 0:
                scores = orch.evaluate()
                last.update(scores)
                run.keep_best(run.step, scores)
            self.logger.log(run.step, last)
            if on_step is not None:
                on_step(run.step, last)
            if (cfg.checkpoint_every and run.step % cfg.checkpoint_every == 0) or run.step == stop:
                run.checkpoint()
        run.wait_checkpoint()  # checkpoint_async: the last one finished before the run ends
        if run.step >= cfg.steps:
            run.export_final()
        orch.close()
        self.logger.close()
        return {"run_dir": str(self.run_dir), "step": run.step, "resumed": resumed, "last": last}
