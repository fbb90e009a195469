"""The orchestrator role of the trainer: where trajectories come from and what they are worth — the
rollout backend's lifecycle, the env pool (Ray actors when asked), the rollouts of a training step and
of the held-out evals, and the credit pipeline that turns trajectories into per-token advantages.

    orch = Orchestrator(cfg, policy)
    trajs, credit, stats = orch.collect(step)   # a step's rollout and its credit
    scores = orch.evaluate()                    # eval/... metrics
    orch.close()                                # env pool and kept backend released
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from turngym.core.types import Trajectory
from turngym.trainer.config import TrainConfig
from turngym.trainer.credit.pipeline import CreditOutput, CreditPipeline
from turngym.trainer.credit.registry import build_credit_pipeline
from turngym.trainer.distributed import merge_metrics, shard
from turngym.trainer.judges import judge_win_rate
from turngym.trainer.metrics import backend_counters, breakdown_metrics, reward_metrics, sampled_metrics
from turngym.trainer.oom import check_rollout_oom, explain_oom, rollout_knobs

if TYPE_CHECKING:
    from turngym.trainer.policy import Policy

log = logging.getLogger("turngym.trainer")


def step_seed(seed: int, step: int) -> int:
    """The seed of a training step (sampling, credit) derived from the run's seed: the same at every
    run of one config, different between configs' seeds. Step ``-1`` seeds the sampled eval."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{step}".encode()).digest()[:4], "little")


def build_credit(
    cfg: TrainConfig, model: Any = None, tokenizer: Any = None, judge: Callable | None = None
) -> CreditPipeline:
    """The credit pipeline of ``cfg.credit.method``, built by its registered builder
    (:mod:`turngym.trainer.credit.registry`); IGPO scores with ``model``/``tokenizer``, and a
    ``judge`` given here wins over the arena's configured one (which falls back on the judge the
    env publishes). The env's tool-call parser (``rollout.env_kwargs.parser`` over the registered
    env's defaults, else Hermes) tells IGPO how an answer is written."""
    from turngym.core.registry import UnknownEnvError, spec
    from turngym.tools.parsers import get_parser

    overrides = cfg.rollout.env_kwargs
    try:
        parser = spec(cfg.rollout.env).parser(overrides)
    except UnknownEnvError:  # an env the registry does not know: the run's own kwargs alone
        parser = overrides.get("parser", "hermes")
    parser = get_parser(parser)
    return build_credit_pipeline(
        cfg.credit,
        model=model,
        tokenizer=tokenizer,
        seed=cfg.seed,
        judge=judge,
        parser=parser,
        env=cfg.rollout.env,
    )


class Orchestrator:
    """Rollouts (training and eval) against the policy, and their credit."""

    def __init__(self, cfg: TrainConfig, policy: Policy, judge: Callable | None = None):
        self.cfg, self.policy, self.dist = cfg, policy, policy.dist
        self.run_dir = Path(cfg.run_dir)
        self.judge = judge
        self.credit = build_credit(cfg, policy.full_model, policy.tokenizer, judge)
        self._eval_judge: Callable | None = None  # rollout.eval_judge's, built on first use
        self.env_pool: Any = None  # cluster.env_actors' Ray pool, made at the first rollout
        self.kept_backend: Any = None  # rollout.keep_backend's backend, made at the first rollout
        self.wake_s = 0.0  # the last wake of a sleeping kept engine (rollout.sleep_during_update)
        self._warned_reuse = False  # the prefix-reuse warning (``note_reuse``) is given once a run

    # ----------------------------------------------------------- resources
    def _env(self) -> Any:
        """The env id, or (``cluster.env_actors > 0``) a pool of Ray actors hosting the envs."""
        c = self.cfg.cluster
        if c.env_actors <= 0:
            return self.cfg.rollout.env
        if self.env_pool is None:
            from turngym.rollout.ray_envs import RayEnvPool

            memory = c.env_actor_memory_mb * 2**20 if c.env_actor_memory_mb else None
            self.env_pool = RayEnvPool(
                self.cfg.rollout.env,
                c.env_actors,
                num_cpus=c.env_actor_cpus,
                memory=memory,
                resources=c.env_actor_resources,
                address=c.ray_address,
            )
        return self.env_pool

    def _backend(self) -> Any:
        """The rollout's token backend (``rollout.backend``, see ``TrainConfig.backend_spec``): vLLM
        servers when weights sync to them, else the policy itself served in-process."""
        from turngym.agents.factory import make_token_backend

        spec = self.cfg.backend_spec()
        if spec.kind != "hf":
            return make_token_backend(spec)
        kept = self.kept_backend
        if kept is not None:  # rollout.keep_backend: the weights moved since its last rollout
            if getattr(kept, "asleep", None) is not None:  # rollout.sleep_during_update: slots back
                t0 = time.perf_counter()
                kept.wake()
                self.wake_s = time.perf_counter() - t0
            kept.reset_prefix_cache()
            return kept
        # a long batching window keeps batch composition (and so sampling) reproducible
        p = self.policy
        backend = make_token_backend(spec, model=p.full_model, tokenizer=p.tokenizer, max_wait_ms=50)
        if self.cfg.rollout.keep_backend or self.cfg.rollout.sleep_during_update:
            self.kept_backend = backend
        return backend

    def sleep_engine(self) -> float | None:
        """``rollout.sleep_during_update``: the kept engine gives its KV slots (and graphs, at level
        ``kv+graphs``) back for the update; seconds it took, None when there is nothing to put to
        sleep (not configured, no engine yet, or one without slots)."""
        kept = self.kept_backend
        if not self.cfg.rollout.sleep_during_update or kept is None or not hasattr(kept, "sleep"):
            return None
        t0 = time.perf_counter()
        kept.sleep(self.cfg.rollout.sleep_level)
        return time.perf_counter() - t0

    def close(self) -> None:
        """Shut the env pool down and give a kept backend's KV slots and graphs back."""
        if self.env_pool is not None:
            self.env_pool.shutdown()
            self.env_pool = None
        kept, self.kept_backend = self.kept_backend, None
        if kept is not None and hasattr(kept, "free_buffers"):
            kept.free_buffers()

    # ------------------------------------------------------------- rollout
    def rollout(
        self,
        seeds: list[int],
        group_size: int,
        temperature: float,
        env_kwargs: dict | None = None,
        tree: Any = None,
        vine: Any = None,
    ) -> tuple[list[Trajectory], dict]:
        """One rollout of ``seeds`` (``tree``: a ``TreeConfig``, a tree per task instead of groups;
        ``vine``: a ``VineConfig``, forked value estimates of each state for ``credit.method=vine``). With
        ``rollout.source: harness`` the outside harness plays instead (``turngym.trainer.harness_rollout``;
        its requests carry their own sampling parameters)."""
        r = self.cfg.rollout
        if r.source == "harness":
            from turngym.trainer.harness_rollout import harness_rollout

            backend = self._backend()
            trajs, stats = harness_rollout(
                self.cfg,
                backend,
                self.policy.tokenizer,
                seeds,
                group_size,
                r.env_kwargs if env_kwargs is None else env_kwargs,
                keep_backend=backend is self.kept_backend,
            )
            self._warn_masked(trajs)
            return trajs, stats
        from turngym.agents.backend import SamplingParams
        from turngym.agents.llm import LLMAgent
        from turngym.rollout.engine import RolloutConfig, RolloutEngine
        from turngym.trainer.batching import matmul_precision

        backend = self._backend()
        agent = LLMAgent(
            backend,
            self.policy.tokenizer,
            SamplingParams(max_tokens=r.max_tokens, temperature=temperature, top_p=r.top_p),
            max_context=r.max_context,
            adapter=self.policy.adapter,
        )
        engine = RolloutEngine(
            self._env(),
            agent,
            RolloutConfig(
                group_size=group_size,
                max_concurrency=r.max_concurrency,
                turn_timeout=r.turn_timeout,
                max_turns=r.max_turns,
                tree=tree,
                vine=vine,
                sampling_seed=self.cfg.seed,  # seeds of one config sample differently from the same tasks
            ),
            env_kwargs=r.env_kwargs if env_kwargs is None else env_kwargs,
            env_id=r.env,
        )
        counters: dict[str, float] = {}
        before = backend_counters(backend)  # a kept backend's counters run on: this rollout's share

        async def run() -> list[Trajectory]:
            try:
                return await engine.run(seeds)
            finally:
                counters.update(backend_counters(backend))  # before aclose: a worker answers while it lives
                await backend.aclose()
                if backend is not self.kept_backend and hasattr(backend, "free_buffers"):
                    backend.free_buffers()  # the slots engine's KV and graphs: the update needs the room

        knobs = partial(rollout_knobs, self.cfg)
        with matmul_precision(r.matmul_precision), explain_oom("rollout", knobs, self.policy.device):
            trajs = asyncio.run(run())
        check_rollout_oom(trajs, knobs, self.policy.device)  # an engine's OOM masks rows: say it, stop
        self._warn_masked(trajs)
        counters = {k: v - before.get(k, 0.0) for k, v in counters.items()}
        return trajs, {**engine.stats.as_dict(), "backend": counters}

    @staticmethod
    def _warn_masked(trajs: list[Trajectory]) -> None:
        """Say why trajectories were masked, once per rollout: a silent fully-masked run trains nothing."""
        masked = [t for t in trajs if t.masked]
        if masked:
            reasons = Counter(t.mask_reason.split(":")[0] for t in masked)
            first = masked[0]
            log.warning(
                "%d/%d trajectories masked (%s); first: %s %s",
                len(masked),
                len(trajs),
                dict(reasons),
                first.mask_reason[:500],
                first.metadata.get("error", "")[:2000],
            )

    def collect(self, step: int) -> tuple[list[Trajectory], CreditOutput, dict[str, float]]:
        """Training step ``step``'s rollout (this rank's share of its tasks, seeded from the step) and
        its credit; returns the trajectories, the credit and the step's rollout metrics."""
        import torch

        cfg, r = self.cfg, self.cfg.rollout
        seeds = [r.task_seed_offset + step * r.tasks_per_step + k for k in range(r.tasks_per_step)]
        seeds = shard(seeds, self.dist)  # every rank rolls out its share of the tasks
        torch.manual_seed(step_seed(cfg.seed, step))
        t0 = time.perf_counter()
        tree = r.tree.config() if r.tree is not None else None
        options = cfg.credit.options(cfg.credit.method)
        vine = options.rollout_config() if getattr(options, "needs_vine_rollouts", False) else None
        trajs, stats = self.rollout(seeds, r.group_size, r.temperature, tree=tree, vine=vine)
        t_rollout = time.perf_counter() - t0
        t1 = time.perf_counter()
        self.credit.begin_step(step, step_seed(cfg.seed, step))
        credit = self.credit(trajs)  # also writes each turn's advantage into turn.info["advantages"]
        for traj in trajs:  # kept for `turngym view`
            traj.metadata["step"] = step + 1
        from turngym.rollout.ledger import ledger_metrics

        metrics = {
            **reward_metrics(trajs),
            **credit.metrics,
            "time/rollout": t_rollout,
            "time/credit": time.perf_counter() - t1,
            "rollout/tokens_per_s": stats["generated_tokens"] / max(t_rollout, 1e-9),
            "rollout/generated_tokens": float(stats["generated_tokens"]),
            **ledger_metrics(trajs, t_rollout),
            **{f"rollout/masked/{k}": float(v) for k, v in stats["mask_reasons"].items()},
            **{f"rollout/tree/{k}": float(v) for k, v in stats.get("tree", {}).items()},
            **{f"rollout/vine/{k}": float(v) for k, v in stats.get("vine", {}).items()},
            **{f"rollout/backend/{k}": v for k, v in stats.get("backend", {}).items()},
        }
        if r.source == "harness":
            from turngym.trainer.harness_rollout import call_ledger

            metrics.update(call_ledger(trajs))
        return trajs, credit, metrics

    # ---------------------------------------------------------------- eval
    def evaluate(self) -> dict[str, float]:
        """The held-out eval: one episode per task at ``rollout.eval_temperature`` (greedy by default,
        ``eval/...``), and with ``rollout.eval_samples`` = k also k episodes per task sampled at
        ``rollout.eval_sample_temperature`` (``eval/sampled/...``). Both count a masked trajectory
        as a failure and reseed sampling from ``cfg.seed`` (the same eval at every step), leaving
        the training RNG as they found it."""
        r = self.cfg.rollout
        if r.eval_tasks <= 0:
            return {}
        import torch

        state = torch.get_rng_state()
        seeds = shard([r.eval_seed_offset + k for k in range(r.eval_tasks)], self.dist)
        env_kwargs = {**r.env_kwargs, **r.eval_env_kwargs}
        torch.manual_seed(self.cfg.seed)
        trajs, _ = self.rollout(seeds, 1, r.eval_temperature, env_kwargs)
        sampled = []
        if r.eval_samples:
            torch.manual_seed(step_seed(self.cfg.seed, -1))  # not a training step's seed
            sampled, _ = self.rollout(seeds, r.eval_samples, r.eval_sample_temperature, env_kwargs)
        torch.set_rng_state(state)
        metrics = {f"eval/{k}": v for k, v in reward_metrics(trajs).items()}
        metrics["eval/episodes"] = float(len(trajs))
        if r.eval_breakdown:
            metrics.update(breakdown_metrics(trajs, r.eval_breakdown, "eval/"))
        if sampled:
            metrics.update({f"eval/sampled/{k}": v for k, v in sampled_metrics(sampled).items()})
        if r.eval_judge:
            metrics.update(self.judge_against_start(trajs))
        return merge_metrics(self.dist, metrics, summed=("eval/episodes", "eval/sampled/episodes"))

    def judge_against_start(self, trajs: list[Trajectory]) -> dict[str, float]:
        """``rollout.eval_judge``: each held-out trajectory against the start policy's on the same
        task seed, judged both orders by the arena's judge (:func:`judge_win_rate`). The first call
        keeps its trajectories as that baseline (a file in the run directory, so a resumed run
        compares with the same one) and reports 0.5, the start policy against itself."""
        from turngym.rollout.store import load_jsonl, save_jsonl

        rank = f".rank-{self.dist.rank}" if self.dist.enabled else ""
        path = self.run_dir / f"eval_baseline{rank}.jsonl"
        if not path.exists():
            save_jsonl(trajs, path)
            return {"eval/judge/win_rate": 0.5, "eval/judge/pairs": float(len(trajs))}
        if self._eval_judge is None:
            from turngym.trainer.credit.arena import build_judge

            self._eval_judge = self.judge or build_judge(
                self.cfg.credit.options("arena"), self.cfg.rollout.env
            )
        return judge_win_rate(trajs, load_jsonl(path), self._eval_judge)

    def note_reuse(self, metrics: dict[str, float], step: int) -> None:
        """``rollout/prefix_reuse``: the share of the rollout's prompt tokens served from parked rows
        (HF backends). Once a run, a warning when rows were evicted while more trajectories ran than
        the backend keeps rows: each later turn of theirs was prefilled in full."""
        reused = metrics.get("rollout/backend/reused_tokens")
        fed = metrics.get("rollout/backend/prompt_tokens")
        if reused is None or fed is None or reused + fed <= 0:
            return
        metrics["rollout/prefix_reuse"] = reuse = reused / (reused + fed)
        r, rows = self.cfg.rollout, self.cfg.backend_spec().max_batch_size
        evicted = metrics.get("rollout/backend/parked_evicted", 0.0)
        if evicted and r.max_concurrency > rows and not self._warned_reuse:
            self._warned_reuse = True
            log.warning(
                "step %d: %d parked rows were evicted and %.0f%% of the prompt tokens came from parked "
                "rows: %d trajectories run at once (rollout.max_concurrency) but the backend keeps %d "
                "rows (rollout.backend.max_batch_size), so a turn's row can be evicted before its next "
                "turn and the whole conversation is prefilled again. Raise max_batch_size (a smaller "
                "rollout.max_context fits more slots) or lower max_concurrency.",
                step,
                evicted,
                100 * reuse,
                r.max_concurrency,
                rows,
            )
