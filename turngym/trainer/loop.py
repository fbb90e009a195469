"""The RL loop: rollout -> credit -> policy update (micro-batches, gradient accumulation) -> weight
sync -> log -> checkpoint, with an optional SFT warm start and exact resume.

    trainer = Trainer(load_config("examples/configs/igpo_search_qa.yaml"))
    summary = trainer.train()

Generation runs through the HF backend in the same process, sharing the trained module (CPU or
GPU), or through vLLM servers with LoRA adapters hot-loaded after each update. Every step's task
seeds follow from the step index (the data position) and sampling is reseeded per step, so a run
resumed from a checkpoint continues exactly like an uninterrupted one. The run's ``seed`` is mixed
into every sampling seed (``RolloutConfig.sampling_seed``): two seeds of one config see the same tasks
and sample differently.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from turngym.core.types import Trajectory
from turngym.rollout.ledger import ledger_metrics
from turngym.trainer.config import TrainConfig
from turngym.trainer.credit.pipeline import CreditPipeline
from turngym.trainer.credit.registry import build_credit_pipeline
from turngym.trainer.distributed import main_first, merge_metrics, shard, sync_context, zero_backward
from turngym.trainer.judges import judge_win_rate

log = logging.getLogger("turngym.trainer")


def build_credit(
    cfg: TrainConfig, model: Any = None, tokenizer: Any = None, judge: Callable | None = None
) -> CreditPipeline:
    """The credit pipeline of ``cfg.credit.method``, built by its registered builder
    (:mod:`turngym.trainer.credit.registry`); IGPO scores with ``model``/``tokenizer``, and a
    ``judge`` given here wins over the arena's configured one (which falls back on the judge the
    env publishes). The env's tool-call parser (``rollout.env_kwargs.parser`` over the registered
    env's defaults, else Hermes) tells IGPO how an answer is written."""
    from turngym.core.registry import spec
    from turngym.tools.parsers import get_parser

    try:
        defaults = dict(spec(cfg.rollout.env).kwargs)
    except Exception:  # noqa: BLE001 - an env the registry does not know: its kwargs alone
        defaults = {}
    parser = get_parser({**defaults, **cfg.rollout.env_kwargs}.get("parser", "hermes"))
    return build_credit_pipeline(
        cfg.credit,
        model=model,
        tokenizer=tokenizer,
        seed=cfg.seed,
        judge=judge,
        parser=parser,
        env=cfg.rollout.env,
    )


def _schedule(kind: str, warmup: int, total: int) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if kind == "constant" or total <= warmup:
            return 1.0
        frac = min((step - warmup) / max(total - warmup, 1), 1.0)
        return 1.0 - frac if kind == "linear" else 0.5 * (1.0 + math.cos(math.pi * frac))

    return factor


class Trainer:
    """One training run described by a :class:`TrainConfig`."""

    def __init__(self, config: TrainConfig, judge: Callable | None = None):
        self.cfg = config
        self.run_dir = Path(config.run_dir)
        self.judge = judge
        self._eval_judge: Callable | None = None  # rollout.eval_judge's, built on first use
        self.step = 0
        self._setup_done = False

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        import torch

        from turngym.agents.models import default_device, load_model, load_tokenizer
        from turngym.trainer.distributed import NullLogger, init_distributed, wrap_ddp
        from turngym.trainer.metrics import MetricLogger

        cfg = self.cfg
        self.dist = init_distributed(cfg.cluster.ddp_backend)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.dist.is_main:
            (self.run_dir / "config.json").write_text(cfg.model_dump_json(indent=1))
        torch.manual_seed(cfg.seed)
        self.tokenizer = load_tokenizer(cfg.model.path)
        device = self.dist.device(cfg.model.device) or default_device()
        if cfg.model.gpu_memory_fraction is not None:
            cap_gpu_memory(cfg.model.gpu_memory_fraction, device)
        model = load_model(cfg.model.path, device=device, dtype=cfg.model.dtype)
        if cfg.model.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        self.ref_model = None
        if cfg.model.lora is not None:
            from peft import LoraConfig, get_peft_model

            lora = cfg.model.lora
            model = get_peft_model(
                model,
                LoraConfig(
                    r=lora.r,
                    lora_alpha=lora.alpha,
                    lora_dropout=lora.dropout,
                    target_modules=lora.target_modules,
                    task_type="CAUSAL_LM",
                ),
            )
        elif cfg.loss.kl_coef > 0:
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        self.model = model.eval()  # no dropout: training logprobs match the sampling ones
        self.ddp_model = wrap_ddp(self.model, self.dist)  # the update's forward; rollouts use self.model
        self.device = next(model.parameters()).device
        params = [p for p in model.parameters() if p.requires_grad]
        o = cfg.optim
        self.optimizer = torch.optim.AdamW(params, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay)
        total = cfg.steps * o.ppo_epochs
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, _schedule(o.schedule, o.warmup_steps, total)
        )
        self.credit = build_credit(cfg, self.model, self.tokenizer, self.judge)
        self.sync = self._build_sync()
        self.logger = (
            MetricLogger(
                self.run_dir, cfg.log.tensorboard, cfg.log.wandb, cfg.log.wandb_project, cfg.model_dump()
            )
            if self.dist.is_main
            else NullLogger()
        )
        self._env_pool = None
        self._kept_backend: Any = None  # rollout.keep_backend's backend, made at the first rollout
        self._warned_reuse = False  # the prefix-reuse warning (``_note_reuse``) is given once a run
        self.adapter: str | None = None
        self._setup_done = True

    def _build_sync(self):
        from turngym.trainer.weight_sync import InProcessSync, VLLMFullSync, VLLMLoRASync

        if self.cfg.weight_sync == "vllm_lora":
            return VLLMLoRASync(self.cfg.vllm_urls, self.run_dir / "adapters")
        if self.cfg.weight_sync == "vllm_full":
            return VLLMFullSync(self.cfg.vllm_urls, self.run_dir / "weights")
        return InProcessSync()

    def _env(self):
        """The env id, or (``cluster.env_actors > 0``) a pool of Ray actors hosting the envs."""
        c = self.cfg.cluster
        if c.env_actors <= 0:
            return self.cfg.rollout.env
        if self._env_pool is None:
            from turngym.rollout.ray_envs import RayEnvPool

            memory = c.env_actor_memory_mb * 2**20 if c.env_actor_memory_mb else None
            self._env_pool = RayEnvPool(
                self.cfg.rollout.env,
                c.env_actors,
                num_cpus=c.env_actor_cpus,
                memory=memory,
                resources=c.env_actor_resources,
                address=c.ray_address,
            )
        return self._env_pool

    def _sync_weights(self, step: int) -> None:
        """Rank 0 pushes the weights to the inference side; every rank learns the adapter name."""
        adapter = self.sync(self.model, step) if self.dist.is_main else None
        self.adapter = self.dist.broadcast(adapter)

    def _release_backend(self) -> None:
        """Give a kept backend's KV slots and graphs back (the end of ``train``)."""
        kept, self._kept_backend = self._kept_backend, None
        if kept is not None and hasattr(kept, "free_buffers"):
            kept.free_buffers()

    def _backend(self):
        """The rollout's token backend (``rollout.backend``, see ``TrainConfig.backend_spec``): vLLM
        servers when weights sync to them, else the policy itself served in-process."""
        from turngym.agents.factory import make_token_backend

        spec = self.cfg.backend_spec()
        if spec.kind != "hf":
            return make_token_backend(spec)
        kept = self._kept_backend
        if kept is not None:  # rollout.keep_backend: the weights moved since its last rollout
            kept.reset_prefix_cache()
            return kept
        # a long batching window keeps batch composition (and so sampling) reproducible
        backend = make_token_backend(spec, model=self.model, tokenizer=self.tokenizer, max_wait_ms=50)
        if self.cfg.rollout.keep_backend:
            self._kept_backend = backend
        return backend

    # ---------------------------------------------------------------- rollout
    def rollout(
        self,
        seeds: list[int],
        group_size: int,
        temperature: float,
        env_kwargs: dict | None = None,
        tree: Any = None,
    ) -> tuple[list[Trajectory], dict]:
        """One rollout of ``seeds`` (``tree``: a ``TreeConfig``, a tree per task instead of groups)."""
        from turngym.agents.backend import SamplingParams
        from turngym.agents.llm import LLMAgent
        from turngym.rollout.engine import RolloutConfig, RolloutEngine
        from turngym.trainer.batching import matmul_precision

        r = self.cfg.rollout
        backend = self._backend()
        agent = LLMAgent(
            backend,
            self.tokenizer,
            SamplingParams(max_tokens=r.max_tokens, temperature=temperature, top_p=r.top_p),
            max_context=r.max_context,
            adapter=self.adapter,
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
                if backend is not self._kept_backend and hasattr(backend, "free_buffers"):
                    backend.free_buffers()  # the slots engine's KV and graphs: the update needs the room

        with matmul_precision(r.matmul_precision):
            trajs = asyncio.run(run())
        masked = [t for t in trajs if t.masked]
        if masked:  # say why, once per rollout: a silent fully-masked run trains nothing
            reasons = Counter(t.mask_reason for t in masked)
            log.warning(
                "%d/%d trajectories masked (%s); first error: %s",
                len(masked),
                len(trajs),
                dict(reasons),
                masked[0].metadata.get("error", "")[:2000],
            )
        counters = {k: v - before.get(k, 0.0) for k, v in counters.items()}
        return trajs, {**engine.stats.as_dict(), "backend": counters}

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
            torch.manual_seed(_derive(self.cfg.seed, -1))  # not a training step's seed
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

    # ----------------------------------------------------------------- update
    def update(self, trajs: list[Trajectory], token_adv: list[np.ndarray]) -> dict[str, float]:
        import torch

        from turngym.trainer.batching import (
            micro_batches,
            mixed_precision,
            pad_right,
            token_logprobs,
            train_mode_without_dropout,
        )
        from turngym.trainer.loss import LossConfig, policy_loss

        cfg = self.cfg
        keep = [k for k, t in enumerate(trajs) if not t.masked and t.token_ids and any(t.loss_mask)]
        seqs = [trajs[k] for k in keep]
        advs = [token_adv[k] for k in keep]
        # denominators of the global batch (all ranks): each rank's loss is its share of the batch loss
        num_tokens, num_seqs = self.dist.all_sum([sum(sum(t.loss_mask) for t in seqs), len(seqs)])
        if not num_seqs:
            return {"update/skipped": 1.0}
        loss_cfg = LossConfig(**cfg.loss.model_dump())
        params = [p for p in self.model.parameters() if p.requires_grad]
        groups = micro_batches([len(t.token_ids) for t in seqs], cfg.optim.micro_batch_tokens)
        scale = self.dist.loss_scale  # DDP averages gradients over ranks; the shares must add up
        stats: dict[str, list[float]] = {}
        grad_norms = []
        dev = self.device
        with train_mode_without_dropout(self.model):  # train mode, or gradient checkpointing is off
            for _ in range(cfg.optim.ppo_epochs):
                self.optimizer.zero_grad(set_to_none=True)
                if not groups:  # nothing here, but this rank must join the gradient all-reduce
                    zero_backward(self.ddp_model, dev)
                for g, group in enumerate(groups):
                    batch = [seqs[k] for k in group]
                    ids = pad_right([t.token_ids for t in batch], 0, torch.long, dev)
                    attn = pad_right([[1] * len(t.token_ids) for t in batch], 0, torch.long, dev)
                    mask = pad_right([t.loss_mask for t in batch], 0, torch.float32, dev)
                    old = pad_right([t.logprobs for t in batch], 0.0, torch.float32, dev)
                    adv = pad_right([advs[k] for k in group], 0.0, torch.float32, dev)
                    # DDP all-reduces gradients only in the last micro-batch's backward
                    with sync_context(self.ddp_model, last=g == len(groups) - 1):
                        chunk = cfg.optim.logprob_chunk_tokens
                        with mixed_precision(self.model, cfg.model.autocast):  # forward passes only
                            logp, entropy = token_logprobs(
                                self.ddp_model,
                                ids,
                                attn,
                                with_entropy=loss_cfg.entropy_coef > 0,
                                chunk_tokens=chunk,
                            )
                            ref = None
                            if loss_cfg.kl_coef > 0:
                                with torch.no_grad():
                                    if self.ref_model is not None:
                                        ref, _ = token_logprobs(self.ref_model, ids, attn, chunk_tokens=chunk)
                                    else:
                                        with self.model.disable_adapter():
                                            ref, _ = token_logprobs(self.model, ids, attn, chunk_tokens=chunk)
                        loss, s = policy_loss(
                            logp, old, adv, mask, loss_cfg, ref, entropy, num_tokens, num_seqs
                        )
                        (loss * scale).backward()
                    # pg_loss and loss are this micro-batch's share of the batch loss; the rest are token
                    # means of the micro-batch, weighted by its share of the batch's tokens
                    weight = float(mask.sum()) / num_tokens
                    for k, v in s.items():
                        stats.setdefault(k, []).append(v if k == "pg_loss" else v * weight)
                    stats.setdefault("loss", []).append(float(loss.detach()))
                grad_norms.append(float(torch.nn.utils.clip_grad_norm_(params, cfg.optim.max_grad_norm)))
                self.optimizer.step()
                self.scheduler.step()
        out = {f"update/{k}": float(sum(v)) / cfg.optim.ppo_epochs for k, v in stats.items()}
        out["update/micro_batches"] = float(len(groups))
        out = merge_metrics(self.dist, out, summed=("update/",))  # shares of the global batch add up
        out["update/grad_norm"] = float(np.mean(grad_norms))
        out["update/lr"] = float(self.scheduler.get_last_lr()[0])
        out["update/tokens"] = num_tokens
        return out

    # ------------------------------------------------------------------- step
    def train_step(self) -> dict[str, float]:
        import torch

        cfg, r = self.cfg, self.cfg.rollout
        step = self.step
        seeds = [r.task_seed_offset + step * r.tasks_per_step + k for k in range(r.tasks_per_step)]
        seeds = shard(seeds, self.dist)  # every rank rolls out its share of the tasks
        torch.manual_seed(_derive(cfg.seed, step))
        timings = {}
        t0 = time.perf_counter()
        tree = r.tree.config() if r.tree is not None else None
        trajs, rstats = self.rollout(seeds, r.group_size, r.temperature, tree=tree)
        timings["time/rollout"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        self.credit.begin_step(step, _derive(cfg.seed, step))
        credit = self.credit(trajs)  # also writes each turn's advantage into turn.info["advantages"]
        for traj in trajs:  # kept for `turngym view`
            traj.metadata["step"] = step + 1
        timings["time/credit"] = time.perf_counter() - t1
        t2 = time.perf_counter()
        upd = self.update(trajs, credit.token_advantages)
        timings["time/update"] = time.perf_counter() - t2
        t3 = time.perf_counter()
        self._sync_weights(step + 1)
        timings["time/sync"] = time.perf_counter() - t3
        self.step += 1
        metrics = {
            **reward_metrics(trajs),
            **credit.metrics,
            **upd,
            **timings,
            "rollout/tokens_per_s": rstats["generated_tokens"] / max(timings["time/rollout"], 1e-9),
            "rollout/generated_tokens": float(rstats["generated_tokens"]),
            **ledger_metrics(trajs, timings["time/rollout"]),
            **{f"rollout/masked/{k}": float(v) for k, v in rstats["mask_reasons"].items()},
            **{f"rollout/tree/{k}": float(v) for k, v in rstats.get("tree", {}).items()},
            **{f"rollout/backend/{k}": v for k, v in rstats.get("backend", {}).items()},
            "time/step": time.perf_counter() - t0,
        }
        metrics = merge_metrics(
            self.dist,
            metrics,
            summed=(
                "rollout/masked/",
                "rollout/generated_tokens",
                "rollout/tokens_per_s",
                "rollout/time/",
                "rollout/trajectories_per_hour",
                "rollout/tree/",
                "rollout/backend/",
            ),
        )
        self._note_reuse(metrics)
        if cfg.log.save_trajectories:
            rank = f".rank-{self.dist.rank}" if self.dist.enabled else ""
            out = self.run_dir / "trajectories" / f"step-{step + 1:06d}{rank}.jsonl"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text("".join(t.to_json() + "\n" for t in trajs))
        return metrics

    def _note_reuse(self, metrics: dict[str, float]) -> None:
        """``rollout/prefix_reuse``: the share of the rollout's prompt tokens served from parked rows
        (HF backends). Once a run, a warning when rows were evicted while more trajectories ran than
        the backend keeps rows: each later turn of theirs was prefilled in full (issue 19: a
        search-qa run fed 285k prompt tokens a rollout for 14k generated, 1.4 % reused)."""
        reused = metrics.get("rollout/backend/reused_tokens")
        fed = metrics.get("rollout/backend/prompt_tokens")
        if reused is None or fed is None or reused + fed <= 0:
            return
        metrics["rollout/prefix_reuse"] = reuse = reused / (reused + fed)
        r = self.cfg.rollout
        evicted = metrics.get("rollout/backend/parked_evicted", 0.0)
        if evicted and r.max_concurrency > r.max_batch_size and not self._warned_reuse:
            self._warned_reuse = True
            log.warning(
                "step %d: %d parked rows were evicted and %.0f%% of the prompt tokens came from parked "
                "rows: %d trajectories run at once (rollout.max_concurrency) but the backend keeps %d "
                "rows (rollout.max_batch_size), so a turn's row can be evicted before its next turn "
                "and the whole conversation is prefilled again. Raise max_batch_size (a smaller "
                "rollout.max_context fits more slots) or lower max_concurrency.",
                self.step,
                evicted,
                100 * reuse,
                r.max_concurrency,
                r.max_batch_size,
            )

    # ------------------------------------------------------------------- run
    def warm_start(self) -> dict[str, float]:
        """SFT on expert trajectories (``cfg.sft``), unless a checkpoint or a finished warm start exists."""
        from turngym.trainer.sft import expert_sequences, sft_train

        s, r = self.cfg.sft, self.cfg.rollout
        marker = self.run_dir / "sft_done.json"
        if s.steps <= 0 or marker.exists():
            return {}
        t0 = time.perf_counter()
        seqs = expert_sequences(
            r.env,
            self.tokenizer,
            range(s.task_seed_offset, s.task_seed_offset + s.tasks),
            self.cfg.sft_env_kwargs(),
        )
        losses = sft_train(
            self.model,
            seqs,
            steps=s.steps,
            batch_size=s.batch_size,
            lr=s.lr,
            seed=self.cfg.seed,
            autocast=self.cfg.model.autocast,
        )
        self.model.eval()
        from turngym.trainer.checkpoint import WARM_START, save_weights, trainable_state

        save_weights(self.run_dir / WARM_START, trainable_state(self.model))
        info = {
            "sft/loss_first": losses[0],
            "sft/loss_last": losses[-1],
            "sft/sequences": float(len(seqs)),
            "sft/seconds": time.perf_counter() - t0,
        }
        marker.write_text(json.dumps(info))
        return info

    def _load_warm_start(self) -> dict[str, float]:
        """A rank other than 0 loads the warm start rank 0 just wrote (if it ran one)."""
        from turngym.trainer.checkpoint import WARM_START, load_weights

        sft = self.run_dir / WARM_START
        if sft.exists():
            self.model.load_state_dict(load_weights(sft), strict=False)
        return {}

    def resume(self) -> bool:
        """Continue from the newest intact checkpoint (:func:`restore_run`), else start over at step 0;
        either way the metrics rows the run will log again are dropped."""
        from turngym.trainer.checkpoint import restore_run

        if not self.cfg.resume:
            return False
        with main_first(self.dist) as first:  # rank 0 sets damaged checkpoints aside; the others follow
            state = restore_run(self.run_dir, self.model, self.optimizer, self.scheduler, first)
        self.step = int(state["step"]) if state is not None else 0
        if self.dist.is_main:  # rows of steps after the resumed one are redone: no duplicates, no gaps
            self.logger.rewind(self.step)
        if self.step:
            self._sync_weights(self.step)
        return state is not None

    def _keep_best(self, step: int, scores: dict[str, float]) -> None:
        """``keep_best``: export the policy to ``run_dir/best`` when this eval beats every earlier one
        (strictly; ``best/best.json`` holds the record, so a resumed run goes on from it)."""
        best = self.cfg.keep_best
        if best is None or not scores:
            return
        if best.metric not in scores:
            known = ", ".join(sorted(k for k in scores if not k.startswith("eval/by_")))
            raise ValueError(
                f"keep_best.metric {best.metric!r} is not an eval metric of this run; it has: {known}"
            )
        value = float(scores[best.metric])
        record = self.run_dir / "best" / "best.json"
        if math.isnan(value):
            return
        if record.exists():
            held = json.loads(record.read_text())["value"]
            if not (value > held if best.mode == "max" else value < held):
                return
        if self.dist.is_main:
            from turngym.trainer.checkpoint import export_policy

            info = {"step": step, "metric": best.metric, "mode": best.mode, "value": value}
            masked = scores.get("eval/reward/masked_frac")
            if masked is not None:
                info["masked_frac"] = masked
            export_policy(self.model, self.tokenizer, self.run_dir / "best", info)
        self.dist.barrier()

    def save(self) -> Path:
        from turngym.trainer.checkpoint import save_checkpoint

        return save_checkpoint(
            self.run_dir,
            self.step,
            self.model,
            self.optimizer,
            self.scheduler,
            {"config_hash": _config_hash(self.cfg)},
            self.cfg.keep_checkpoints,
        )

    def train(
        self, max_steps: int | None = None, on_step: Callable[[int, dict], None] | None = None
    ) -> dict[str, Any]:
        """Run until ``cfg.steps`` (or ``max_steps`` more steps, to interrupt a run on purpose)."""
        if not self._setup_done:
            self.setup()
        cfg = self.cfg
        resumed = self.resume()
        fresh = not resumed and self.step == 0
        if fresh:
            # the untrained policy's held-out score, so a report can say what the warm start itself did
            before = self.evaluate() if cfg.sft.steps > 0 and cfg.sft.eval_before else {}
            with main_first(self.dist) as first:  # one warm start; the other ranks load its weights
                info = self.warm_start() if first else self._load_warm_start()
            info = {**{k.replace("eval/", "eval_before_sft/", 1): v for k, v in before.items()}, **info}
            if info:
                self.logger.log(0, info)
        if cfg.weight_sync != "in_process":  # servers hold the base model: push the warm-started/resumed one
            self._sync_weights(self.step)
        if fresh:
            base = self.evaluate()
            if base:
                self.logger.log(0, base)
                self._keep_best(0, base)
        stop = cfg.steps if max_steps is None else min(cfg.steps, self.step + max_steps)
        last: dict[str, float] = {}
        while self.step < stop:
            last = self.train_step()
            r = cfg.rollout
            if r.eval_every and self.step % r.eval_every == 0:
                scores = self.evaluate()
                last.update(scores)
                self._keep_best(self.step, scores)
            self.logger.log(self.step, last)
            if on_step is not None:
                on_step(self.step, last)
            if (cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0) or self.step == stop:
                with main_first(self.dist) as first:
                    if first:
                        self.save()
        if self.step >= cfg.steps and self.dist.is_main:
            from turngym.trainer.checkpoint import export_policy

            export_policy(self.model, self.tokenizer, self.run_dir / "final")
        if self._env_pool is not None:
            self._env_pool.shutdown()
            self._env_pool = None
        self._release_backend()
        self.logger.close()
        return {"run_dir": str(self.run_dir), "step": self.step, "resumed": resumed, "last": last}


def cap_gpu_memory(fraction: float, device: str) -> int | None:
    """Cap this process's share of a CUDA device's memory (``"cuda"`` = the current device); returns
    the device index, or None for a non-CUDA device (nothing to cap)."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    return index


def breakdown_metrics(trajs: list[Trajectory], key: str, prefix: str = "") -> dict[str, float]:
    """The headline metrics per value of ``reference[key]`` (e.g. per hop count), as
    ``{prefix}by_{key}/{value}/reward/outcome`` with the share of trajectories (``.../frac``); a
    trajectory without the key counts under ``none``."""
    groups: dict[str, list[Trajectory]] = {}
    for t in trajs:
        groups.setdefault(str(t.reference.get(key, "none")), []).append(t)
    out = {}
    for value, group in sorted(groups.items()):
        head = f"{prefix}by_{key}/{value}/"
        m = reward_metrics(group)
        out[head + "frac"] = len(group) / len(trajs)
        for name in ("reward/outcome", "reward/masked_frac", "episode/turns"):
            if name in m:
                out[head + name] = m[name]
    return out


def reward_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """Outcome and total reward logged separately, success, turns, invalid actions, masking.

    The headline numbers (``reward/outcome``, ``reward/success``) count a masked trajectory as a
    failure (outcome 0, no success): a run whose rollouts crash must not report the score of its few
    survivors. ``reward/outcome_unmasked`` is the mean over unmasked trajectories only, and
    ``reward/masked_frac`` always travels beside them.

    ``reward/component/<name>``: each reward component the env reported, summed over a trajectory's
    turns and averaged over the unmasked trajectories (0 where a trajectory never got it), so a run
    shows which constraint or critic moves (travel's ``hard.*`` / ``cs.*`` checks, a stepwise
    ``tool_ok``), not only the outcome.
    """
    live = [t for t in trajs if not t.masked]
    if not trajs:
        return {}
    n = len(trajs)
    out = {
        "reward/masked_frac": (n - len(live)) / n,
        "reward/outcome": float(sum(t.outcome for t in live)) / n,
        "reward/success": float(sum(t.terminated and t.outcome >= 1.0 for t in live)) / n,
    }
    if live:
        turns = [x for t in live for x in t.turns]
        out.update(
            {
                "reward/outcome_unmasked": float(np.mean([t.outcome for t in live])),
                "reward/total": float(np.mean([t.total_reward for t in live])),
                "reward/terminated": float(np.mean([t.terminated for t in live])),
                "episode/turns": float(np.mean([t.num_turns for t in live])),
                "episode/invalid_action_frac": float(np.mean([x.invalid_action for x in turns]))
                if turns
                else 0.0,
            }
        )
        sums: dict[str, float] = {}
        for t in live:
            for turn in t.turns:
                for name, value in turn.reward_components.items():
                    sums[name] = sums.get(name, 0.0) + float(value)
        out.update({f"reward/component/{k}": v / len(live) for k, v in sorted(sums.items())})
    return out


def sampled_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """:func:`reward_metrics` over every sampled episode (masked ones count as failures), with
    ``episodes`` (how many) and ``pass_at_k`` (the share of tasks, by group, with at least one
    successful unmasked episode)."""
    if not trajs:
        return {}
    groups: dict[str, bool] = {}
    for t in trajs:
        won = not t.masked and t.terminated and t.outcome >= 1.0
        groups[t.group] = groups.get(t.group, False) or won
    return {
        **reward_metrics(trajs),
        "episodes": float(len(trajs)),
        "pass_at_k": sum(groups.values()) / len(groups),
    }


def _derive(seed: int, step: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{step}".encode()).digest()[:4], "little")


def _config_hash(cfg: TrainConfig) -> str:
    return hashlib.sha1(cfg.model_dump_json().encode()).hexdigest()[:12]


def backend_counters(backend: Any) -> dict[str, float]:
    """The rollout backend's numeric counters (the HF engines' ``stats``: passes, prompt and reused
    tokens, graph captures and their seconds, decode blocks, ...; a backend is made per rollout, so
    they count this rollout); {} for a backend without them or one that cannot answer."""
    try:
        stats = getattr(backend, "stats", None)
    except Exception:  # noqa: BLE001 - a worker that died: the rollout's own errors say why
        return {}
    if not isinstance(stats, dict):
        return {}
    return {k: float(v) for k, v in stats.items() if isinstance(v, int | float) and not isinstance(v, bool)}
