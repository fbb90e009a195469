"""The training configuration: pydantic models loaded from YAML, with dotted command-line overrides.

    cfg = load_config("examples/configs/igpo_search_qa.yaml", ["optim.lr=1e-5", "credit.method=grpo"])

Every field has a default, so ``TrainConfig()`` is a valid (tiny, CPU, ``arith``) run.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from turngym.trainer.memory_budget import MemorySettings, check_sleep_settings

if TYPE_CHECKING:
    from turngym.agents.factory import AgentSpec


#: the learner's data-parallel strategies (``cluster.strategy``)
STRATEGIES = ("ddp", "fsdp")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LoraSettings(_Strict):
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] | str = "all-linear"


class ModelSettings(_Strict):
    path: str = (
        "tiny"  # a local directory, a hub id, a pretrained name (turngym models), or "tiny[:template]"
    )
    device: str | None = None  # default: cuda if available
    dtype: str | None = None  # default: bf16 on GPU, fp32 on CPU
    # "bfloat16": the forward passes of the policy update and the SFT warm start run under bf16 autocast
    # while weights and optimizer state stay in ``dtype`` (fp32 weights at bf16 matmul speed on a GPU)
    autocast: Literal["bfloat16"] | None = None
    lora: LoraSettings | None = None
    gradient_checkpointing: bool = False
    # CUDA only: cap this process's share of the card (torch's caching allocator raises OOM past it),
    # so that several runs (seeds) can share one GPU without one starving the others
    gpu_memory_fraction: float | None = Field(default=None, gt=0.0, le=1.0)


class TreeRolloutSettings(_Strict):
    """``rollout.tree``: grow a tree per task instead of ``group_size`` samples (training rollouts
    only; evaluation stays flat). The fields of ``turngym.rollout.tree.TreeConfig``."""

    k: int = 2
    branch: str = "schedule"  # schedule | tool_call | entropy (turngym.rollout.tree branch policies)
    turns: list[int] = Field(default_factory=lambda: [0])
    entropy_threshold: float = 1.0
    max_nodes: int | None = 64
    max_tokens: int | None = None

    @model_validator(mode="after")
    def _valid(self) -> TreeRolloutSettings:
        self.config()  # the engine's own checks (k >= 2, a known policy, budgets >= 1)
        return self

    def config(self) -> Any:
        from turngym.rollout.tree import TreeConfig

        return TreeConfig(
            k=self.k,
            branch=self.branch,
            turns=tuple(self.turns),
            entropy_threshold=self.entropy_threshold,
            max_nodes=self.max_nodes,
            max_tokens=self.max_tokens,
        )


class HarnessSettings(_Strict):
    """``rollout.harness``: an outside agent program (``rollout.source: harness``) played through
    ``turngym.proxy`` over the policy's own backend; docs/harness.md, "Training"."""

    # a shell command template: {base_url} {api_key} {task} {mcp_url} {episode} (each shell-quoted;
    # also in the child's environment as OPENAI_BASE_URL, OPENAI_API_KEY, TURNGYM_TASK, ...)
    command: str
    model: str = "policy"  # the model name the proxy serves (what the harness asks for)
    # where the reward comes from: "env" (rollout.env's tools over the proxy's MCP door, {mcp_url}:
    # the env's return), "post" (the harness POSTs /v1/episodes/<key>/reward), or "function"
    # (reward_fn, "module:function" of a trajectory, returning a float or (float, components))
    reward: Literal["env", "post", "function"] = "env"
    reward_fn: str | None = None
    concurrency: int = Field(default=16, ge=1)  # harness processes at once
    timeout_s: float = Field(default=300.0, gt=0.0)  # per episode; past it: killed, masked
    reward_timeout_s: float = Field(default=30.0, gt=0.0)  # after the harness exits; then masked
    parser: str = "hermes"  # the tool-call convention the proxy parses the policy's text with
    env: dict[str, str] = Field(default_factory=dict)  # extra environment variables of the harness
    cwd: str | None = None

    @model_validator(mode="after")
    def _check(self) -> HarnessSettings:
        from turngym.proxy.harness import check_template

        check_template(self.command)
        if (self.reward == "function") != (self.reward_fn is not None):
            raise ValueError(
                "rollout.harness.reward_fn is set exactly when rollout.harness.reward is 'function'"
            )
        return self


class RolloutSettings(_Strict):
    @model_validator(mode="before")
    @classmethod
    def _flat_backend_keys(cls, data: Any) -> Any:
        return _move_to_backend(data, {k: k for k in FLAT_BACKEND_KEYS}, "rollout.")

    env: str = "arith"
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    tasks_per_step: int = 4
    group_size: int = 4
    max_tokens: int = 96  # per turn
    temperature: float = 1.0
    top_p: float = 1.0
    max_context: int = 1536
    max_turns: int | None = None
    max_concurrency: int = 64
    # keep the in-process HF backend (its KV slots and captured CUDA graphs) from one rollout to the
    # next instead of making one per rollout: no graph is captured twice, but the slots' memory stays
    # taken during the SFT and RL updates. Parked rows are dropped and the slots engine's fused
    # weights refreshed before each rollout.
    keep_backend: bool = False
    # keep one backend (as keep_backend) and give its KV slots ("kv"), or slots and captured CUDA graphs
    # ("kv+graphs"), back to the card for each update and warm start; taken back at the next rollout
    # (HFSlotBackend.sleep/wake; docs/scaling.md, "One GPU, two phases")
    sleep_during_update: bool = False
    sleep_level: Literal["kv", "kv+graphs"] = "kv+graphs"
    # torch's fp32 matmul precision while the in-process backend generates (an fp32 policy's rollouts;
    # a bf16 policy is unaffected), restored for the update: "high" = TF32 tensor cores on CUDA for its
    # products and the Triton attention's dots (10-bit mantissas in each product, fp32 sums: an H200
    # learning run's rollouts ran 6x faster, the update's ratio to the rollout's logprobs 0.99999,
    # benchmarks/gpu_results.md session 14); "highest" = full fp32; "medium" = bf16; None: torch's own
    matmul_precision: Literal["highest", "high", "medium"] | None = "high"
    # the rollout's token backend: the one home of its settings, in the keys of
    # turngym.agents.factory.AgentSpec (kind, urls, hf_engine, hf_compile, max_batch_size, dtype, ...;
    # its model is model.path, its max_context and max_tokens this section's). Unset: kind hf (the policy
    # served in process) with weight_sync in_process, kind vllm with weight_sync vllm_*. The flat keys
    # rollout.hf_engine / hf_compile / max_batch_size and the URL keys vllm_urls / cluster.vllm_urls
    # are deprecated aliases moved in here (with a FutureWarning).
    backend: dict[str, Any] | None = None
    turn_timeout: float = 600.0
    task_seed_offset: int = 0  # training tasks are seeds offset + k; eval uses eval_seed_offset + k
    eval_tasks: int = 0  # 0: no evaluation
    eval_every: int = 0
    eval_seed_offset: int = 1_000_000
    eval_temperature: float = 0.0  # 0: the greedy held-out eval (eval/...)
    # also evaluate the policy's own samples: eval_samples episodes per held-out task at
    # eval_sample_temperature (eval/sampled/...: success and outcome over all of them, masked ones as
    # failures, and pass@k over the tasks); 0: off. A greedy eval can sit still while RL sharpens the
    # distribution the policy samples from (and trains on): this one shows it.
    eval_samples: int = Field(default=0, ge=0)
    eval_sample_temperature: float = Field(default=1.0, gt=0.0)
    eval_env_kwargs: dict[str, Any] = Field(default_factory=dict)  # merged over env_kwargs (e.g. split: test)
    # eval metrics also per value of this key of the tasks' reference (search-qa: "hops", "kind")
    eval_breakdown: str | None = None
    # eval also judges each held-out trajectory against the start policy's on the same task (the
    # first evaluation after the warm start, kept in run_dir/eval_baseline*.jsonl) with the arena's
    # judge (credit.arena's judge keys, else the env's published one): eval/judge/win_rate
    eval_judge: bool = False
    tree: TreeRolloutSettings | None = None  # tree rollouts for training (turngym.rollout.tree)
    # where trajectories come from: "env" (the policy plays rollout.env as a turngym agent) or
    # "harness" (rollout.harness: an outside agent program calls the policy through turngym.proxy)
    source: Literal["env", "harness"] = "env"
    harness: HarnessSettings | None = None

    @model_validator(mode="after")
    def _source(self) -> RolloutSettings:
        if self.source == "harness" and self.harness is None:
            raise ValueError("rollout.source=harness needs rollout.harness.command")
        if self.source == "harness" and self.tree is not None:
            raise ValueError("rollout.tree grows trees from the env's turns: not with rollout.source=harness")
        return self


class CreditSettings(BaseModel):
    """``credit``: ``method`` (any registered credit method, see
    :mod:`turngym.trainer.credit.registry`), the options every method shares, and each method's own
    options under ``credit.<method>`` (``credit.igpo.norm``, ``credit.gigpo.gamma``, ...), validated
    by that method's settings model. The flat keys of earlier versions (``gigpo_gamma``,
    ``gigpo_omega``, ``gigpo_mode``, ``gigpo_step_norm_by_std``, ``turn_lambda``) are still read,
    with a warning."""

    model_config = ConfigDict(extra="allow")  # the method sections; checked by ``_methods``

    method: str = "grpo"
    outcome_component: str | None = None  # read this reward component of the last turn as the outcome
    norm_by_std: bool = True
    leave_one_out: bool = False

    @model_validator(mode="before")
    @classmethod
    def _methods(cls, data: Any) -> Any:
        from turngym.trainer.credit.registry import credit_methods

        if not isinstance(data, dict):
            return data
        specs = credit_methods()
        data = dict(data)
        method = data.get("method", "grpo")
        if method not in specs:
            raise ValueError(f"unknown credit.method {method!r}; known: {', '.join(sorted(specs))}")
        for spec in specs.values():  # deprecated flat keys -> credit.<method>.<key>
            for flat, key in spec.legacy_keys.items():
                if flat not in data:
                    continue
                value = data.pop(flat)
                section = data.get(spec.name)
                section = section.model_dump() if isinstance(section, BaseModel) else dict(section or {})
                if key in section and section[key] != value:
                    raise ValueError(
                        f"credit.{flat}={value!r} and credit.{spec.name}.{key}={section[key]!r} disagree: "
                        f"set only credit.{spec.name}.{key} (credit.{flat} is deprecated)"
                    )
                warnings.warn(
                    f"credit.{flat} is deprecated; use credit.{spec.name}.{key}", FutureWarning, stacklevel=2
                )
                section[key] = value
                data[spec.name] = section
        unknown = sorted(k for k in data if k not in cls.model_fields and k not in specs)
        if unknown:
            raise ValueError(
                f"unknown credit option(s) {unknown}; shared options: {sorted(cls.model_fields)}; "
                f"method sections: {sorted(specs)}"
            )
        for name, spec in specs.items():
            value = data.get(name)
            if isinstance(value, spec.settings):
                continue
            try:
                data[name] = spec.settings.model_validate(value if value is not None else {})
            except ValidationError as e:
                if value is None and name != method:
                    data.pop(name, None)  # a method whose options have no defaults, not used here
                    continue
                problems = "; ".join(
                    f"credit.{'.'.join([name, *map(str, err['loc'])])}: {err['msg']}" for err in e.errors()
                )
                raise ValueError(problems) from None
        shared = {k: data[k] for k in data if k in cls.model_fields}
        return shared | {name: data[name] for name in sorted(specs) if name in data}

    def options(self, method: str | None = None) -> BaseModel:
        """The settings of ``method`` (default: the selected one), its defaults when not given."""
        from turngym.trainer.credit.registry import get_credit_method

        name = method or self.method
        value = (self.__pydantic_extra__ or {}).get(name)
        return value if value is not None else get_credit_method(name).settings()


class LossSettings(_Strict):
    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float | None = None
    kl_coef: float = 0.0
    kl_type: Literal["k1", "k3"] = "k3"
    entropy_coef: float = 0.0
    aggregation: Literal["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"] = "token_mean"


class OptimSettings(_Strict):
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float = 1.0
    warmup_steps: int = 0
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    ppo_epochs: int = 1
    micro_batch_tokens: int = 8192  # padded tokens per forward/backward
    # output head applied to this many positions at a time (never the full [tokens, vocab] fp32 logits);
    # null: all at once
    logprob_chunk_tokens: int | None = Field(default=4096, gt=0)
    # how the output head's log-probs are computed: "torch" (the head in chunks of logprob_chunk_tokens,
    # each recomputed in backward) or "liger" (liger-kernel's fused linear + cross-entropy on CUDA: the
    # [tokens, vocab] logits never exist beyond one chunk, forward or backward; CPU, and micro-batches
    # that need the entropy, take the torch path). turngym.trainer.batching.token_logprobs
    logprob_kernel: Literal["torch", "liger"] = "torch"
    # the optimizer: "adamw" (torch's; its state has the master weights' dtype), "adamw_8bit" /
    # "adamw_4bit" (torchao's block-wise quantized AdamW state: ~2 / ~1 bytes a parameter instead of 8
    # for fp32 masters). Bytes per parameter of each: docs/scaling.md. turngym.trainer.optimizers
    optimizer: Literal["adamw", "adamw_8bit", "adamw_4bit"] = "adamw"


class SFTSettings(_Strict):
    """Supervised warm start on the env's scripted-expert trajectories (before RL)."""

    steps: int = 0  # 0: no warm start
    tasks: int = 64
    batch_size: int = 8
    lr: float = 1e-3
    task_seed_offset: int = 2_000_000
    # evaluate the policy before the warm start too (logged as eval_before_sft/... at step 0)
    eval_before: bool = True
    # merged over rollout.env_kwargs for the expert's demonstrations only: the warm start can come from
    # a differently configured env (a larger turn budget, arith's double-checking expert) than RL's
    env_kwargs: dict[str, Any] = Field(default_factory=dict)


class LogSettings(_Strict):
    tensorboard: bool = True
    wandb: bool = False
    wandb_project: str = "turngym"
    progress: bool = True
    save_trajectories: bool = True


class BestSettings(_Strict):
    """``keep_best``: after every held-out eval (the start policy's included), the policy with the
    best value of ``metric`` so far is exported to ``run_dir/best`` (weights, or the LoRA adapter, and
    the tokenizer, plus ``best.json``: step, metric, value). RL on a small model can peak and then
    collapse (ArenaRL and pointwise on travel-open, docs/credit.md): this keeps the peak."""

    # any eval metric, e.g. eval/judge/win_rate, eval/sampled/reward/success
    metric: str = "eval/reward/outcome"
    mode: Literal["max", "min"] = "max"

    @model_validator(mode="after")
    def _check(self) -> BestSettings:
        if not self.metric.startswith("eval/"):
            raise ValueError(f"keep_best.metric must be an eval metric (eval/...), got {self.metric!r}")
        return self


class FSDPSettings(_Strict):
    """``cluster.fsdp``: how ``cluster.strategy: fsdp`` shards the policy (FSDP2, one unit per decoder
    layer, then the root; :mod:`turngym.trainer.fsdp`)."""

    # the dtype the layers compute in (all-gathered parameters); None: bfloat16 on CUDA, the model's
    # own dtype elsewhere (CPU/gloo keeps fp32, so the CPU tests compare exactly)
    param_dtype: Literal["bfloat16", "float32"] | None = None
    reduce_dtype: Literal["float32", "bfloat16"] = "float32"  # gradient reduce-scatter
    cpu_offload: bool = False  # sharded parameters, gradients and optimizer state live on the CPU
    reshard_after_forward: bool = True  # free gathered layers after forward (ZeRO-3); False: ZeRO-2
    # free the rollouts' full bf16 copy's trainable weights for the update (2 bytes a parameter on every
    # rank) and rebuild them at the refresh after it (the gradients are freed after the optimizer step,
    # to make room); not with rollout.keep_backend (its CUDA graphs read the copy's buffers at fixed
    # addresses)
    release_full_copy: bool = False
    # reduce-scatter gradients after every micro-batch's backward, not only the last: the shards then
    # accumulate, instead of a whole-model unsharded gradient (fp32 under reduce_dtype float32: 4 bytes
    # a parameter of the full model on every rank) kept between micro-batches; one reduce-scatter per
    # micro-batch instead of one per optimizer step
    reduce_every_micro_batch: bool = False


class ClusterSettings(_Strict):
    """Where the run executes; the rest of the config stays the same from one machine to a cluster."""

    ray_address: str | None = None  # "auto", "ray://head:10001", ...; None: a local Ray started on demand
    env_actors: int = 0  # 0: envs run in the trainer process; N: in N Ray actors
    env_actor_cpus: float = 1.0
    env_actor_memory_mb: int | None = None
    env_actor_resources: dict[str, float] = Field(default_factory=dict)  # e.g. {docker: 1}
    nproc: int = 1  # learner processes (torchrun / turngym train --nproc); one GPU each under NCCL
    ddp_backend: Literal["auto", "nccl", "gloo"] = "auto"
    # how the learner's ranks split the model: ddp (a whole replica per rank) or fsdp (FSDP2 shards)
    strategy: str = "ddp"
    fsdp: FSDPSettings = Field(default_factory=FSDPSettings)
    # seconds a collective may wait for the other ranks before this rank fails (a dead or stuck rank
    # stops the run instead of hanging it)
    timeout_s: float = Field(default=1800.0, gt=0.0)

    @model_validator(mode="after")
    def _check(self) -> ClusterSettings:
        if self.env_actors < 0 or self.nproc < 1 or self.env_actor_cpus < 0:
            raise ValueError("cluster: env_actors >= 0, nproc >= 1 and env_actor_cpus >= 0 are needed")
        if self.strategy not in STRATEGIES:
            raise ValueError(
                f"unknown cluster.strategy {self.strategy!r}; known: {', '.join(STRATEGIES)} "
                "(ddp: a whole replica per rank; fsdp: FSDP2 shards parameters, gradients and optimizer state)"
            )
        return self


class TrainConfig(_Strict):
    run_dir: str = "runs/train"
    # the run's seed: torch's initial RNG (a random-init model's weights), the warm start's data order,
    # and, mixed into every sampling seed, what the policy samples; the training tasks stay the same
    # (rollout.task_seed_offset moves them)
    seed: int = 0
    steps: int = 10
    checkpoint_every: int = 0  # 0: only at the end
    keep_checkpoints: int = 2
    checkpoint_async: bool = False  # sharded checkpoints written in the background (DCP's async_save)
    resume: bool = True  # continue from the latest checkpoint in run_dir if there is one
    weight_sync: Literal["in_process", "vllm_lora", "vllm_full"] = "in_process"
    model: ModelSettings = Field(default_factory=ModelSettings)
    rollout: RolloutSettings = Field(default_factory=RolloutSettings)
    credit: CreditSettings = Field(default_factory=CreditSettings)
    loss: LossSettings = Field(default_factory=LossSettings)
    optim: OptimSettings = Field(default_factory=OptimSettings)
    sft: SFTSettings = Field(default_factory=SFTSettings)
    log: LogSettings = Field(default_factory=LogSettings)
    cluster: ClusterSettings = Field(default_factory=ClusterSettings)
    memory: MemorySettings = Field(default_factory=MemorySettings)  # each phase's share of the card
    # {metric: eval/...}: export the best-scoring policy to run_dir/best
    keep_best: BestSettings | None = None

    def sft_env_kwargs(self) -> dict[str, Any]:
        """The env kwargs of the warm start's expert episodes: ``sft.env_kwargs`` over ``rollout.env_kwargs``."""
        return {**self.rollout.env_kwargs, **self.sft.env_kwargs}

    @model_validator(mode="before")
    @classmethod
    def _url_aliases(cls, data: Any) -> Any:
        """``vllm_urls`` and ``cluster.vllm_urls`` (deprecated) into ``rollout.backend.urls``."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        cluster = dict(data.get("cluster") or {})
        found = {}
        if "vllm_urls" in data:
            found["vllm_urls"] = data.pop("vllm_urls")
        if "vllm_urls" in cluster:
            found["cluster.vllm_urls"] = cluster.pop("vllm_urls")
            data["cluster"] = cluster
        if found:
            rollout = dict(data.get("rollout") or {})
            for key, urls in found.items():
                moved = _move_to_backend({**rollout, key: urls}, {key: "urls"}, "")
                rollout = moved
            data["rollout"] = rollout
        return data

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        self.backend_spec()  # a clear error now, not at the first rollout
        urls = self.backend_spec().urls
        if self.weight_sync == "vllm_lora" and (self.model.lora is None or not urls):
            raise ValueError("weight_sync=vllm_lora needs model.lora and rollout.backend.urls")
        if self.weight_sync == "vllm_full" and (self.model.lora is not None or not urls):
            raise ValueError(
                "weight_sync=vllm_full needs rollout.backend.urls and a full model (no model.lora)"
            )
        from turngym.trainer.credit.registry import get_credit_method

        settings = get_credit_method(self.credit.method).settings
        if getattr(settings, "needs_tree_rollouts", False) and self.rollout.tree is None:
            raise ValueError(f"credit.method={self.credit.method} needs tree rollouts: set rollout.tree")
        fsdp = self.cluster.fsdp
        if fsdp.release_full_copy and self.cluster.strategy != "fsdp":
            raise ValueError(
                "cluster.fsdp.release_full_copy needs cluster.strategy=fsdp (only FSDP keeps a full copy "
                "beside the trained shards)"
            )
        if fsdp.release_full_copy and self.rollout.keep_backend:
            raise ValueError(
                "cluster.fsdp.release_full_copy frees the full copy's weights during the update, but "
                "rollout.keep_backend keeps an engine whose CUDA graphs read them at fixed addresses: "
                "set one of them"
            )
        check_sleep_settings(self)
        if self.checkpoint_async and self.cluster.strategy != "fsdp":
            raise ValueError("checkpoint_async writes sharded checkpoints: it needs cluster.strategy=fsdp")
        if self.rollout.source == "harness" and self.weight_sync == "vllm_lora":
            raise ValueError(
                "rollout.source=harness serves full weights: use weight_sync in_process or vllm_full"
            )
        if getattr(settings, "needs_vine_rollouts", False) and self.rollout.tree is not None:
            raise ValueError(
                f"credit.method={self.credit.method} runs its own forked (vine) rollouts: unset rollout.tree"
            )
        if getattr(settings, "needs_vine_rollouts", False) and self.rollout.source == "harness":
            raise ValueError(
                f"credit.method={self.credit.method} forks the env and the agent mid-episode, which an "
                "outside harness cannot do: use another credit method with rollout.source=harness"
            )
        if self.keep_best is not None and (self.rollout.eval_tasks <= 0 or self.rollout.eval_every <= 0):
            raise ValueError(
                "keep_best needs a held-out eval during RL: set rollout.eval_tasks and rollout.eval_every"
            )
        return self

    @property
    def vllm_urls(self) -> list[str]:
        """The vLLM servers weights sync to (``rollout.backend.urls``)."""
        return list((self.rollout.backend or {}).get("urls") or [])

    def backend_spec(self) -> AgentSpec:
        """The rollout's token backend (``rollout.backend`` over the defaults that ``weight_sync``
        implies). ``weight_sync`` says only how weights move, so the kind must be one they can reach:
        the in-process policy (``hf``) for ``in_process``, vLLM servers (``vllm``) for ``vllm_*``."""
        from turngym.agents.factory import AgentSpec

        r = self.rollout
        kind = "hf" if self.weight_sync == "in_process" else "vllm"
        defaults: dict[str, Any] = {
            "kind": kind,
            "model": self.model.path,
            "max_context": r.max_context,  # the slots engine's KV slots
            "max_tokens": r.max_tokens,
        }
        spec = AgentSpec(**{**defaults, **(r.backend or {})})
        if spec.kind != kind:
            raise ValueError(
                f"rollout.backend.kind={spec.kind!r} cannot receive weight_sync={self.weight_sync!r} "
                f"updates: use kind {kind!r}, or weight_sync "
                + ("vllm_lora/vllm_full" if spec.kind == "vllm" else "in_process")
            )
        if spec.model != self.model.path:
            raise ValueError(
                "rollout.backend.model must be model.path (the policy being trained); leave it unset"
            )
        return spec


#: flat rollout keys of earlier releases that are backend settings (``rollout.backend``'s AgentSpec keys)
FLAT_BACKEND_KEYS = ("hf_engine", "hf_compile", "max_batch_size")


def _move_to_backend(data: Any, keys: dict[str, str], prefix: str) -> Any:
    """Move deprecated ``keys`` of a rollout section (``{old: AgentSpec key}``) into its ``backend``
    with a FutureWarning; a value that disagrees with one already in ``backend`` is an error."""
    if not isinstance(data, dict) or not any(k in data for k in keys):
        return data
    data = dict(data)
    backend = dict(data.get("backend") or {})
    for old, new in keys.items():
        if old not in data:
            continue
        value = data.pop(old)
        if new in backend and backend[new] != value:
            raise ValueError(f"{prefix}{old} and rollout.backend.{new} disagree: set one of them")
        backend[new] = value
        warnings.warn(
            f"{prefix}{old} is deprecated: set rollout.backend.{new} (the one home of backend settings)",
            FutureWarning,
            stacklevel=2,
        )
    data["backend"] = backend
    return data


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``a.b.c=value`` (value parsed as YAML: numbers, booleans, lists, null) into a nested dict."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"override {item!r} is not key=value")
        node = data
        parts = key.strip().split(".")
        for p in parts[:-1]:
            nxt = node.get(p)
            if nxt is None:
                nxt = node[p] = {}
            if not isinstance(nxt, dict):
                raise ValueError(f"override {item!r}: {p!r} is not a section")
            node = nxt
        node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else ""
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Read a YAML config (or start from the defaults) and apply dotted overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        loaded = yaml.safe_load(Path(path).read_text())
        if loaded is not None and not isinstance(loaded, dict):
            raise ValueError(f"{path}: the config must be a mapping, got {type(loaded).__name__}")
        data = loaded or {}
    return TrainConfig.model_validate(apply_overrides(data, list(overrides or [])))


def __getattr__(name: str) -> Any:
    """The method settings that used to live here (``IGPOSettings``, ...) now live in their modules."""
    moved = {
        "IGPOSettings": "igpo",
        "GatedSettings": "gated",
        "ArenaSettings": "arena",
        "GRPOSettings": "grpo",
        "GiGPOSettings": "gigpo",
        "TurnSettings": "dual_level",
    }
    if name in moved:
        import importlib

        return getattr(importlib.import_module(f"turngym.trainer.credit.{moved[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
