"""The policy role of the trainer: the trained model, its tokenizer, its reference, its sharding across
ranks (``cluster.strategy``: DDP or FSDP2), the optimizer and learning-rate schedule, and pushing
weights to inference.

    policy = Policy(cfg, dist)          # loads the model, wraps it, builds AdamW and the schedule
    policy.sync_weights(step)           # full copy refreshed (FSDP); rank 0 pushes to the inference side

The update (:mod:`turngym.trainer.update`) runs its forward through ``policy.wrapped`` (the DDP
module, the FSDP-sharded model, or the model itself in one process). Rollouts, credit scoring and
exports read ``policy.full_model``: the trained module itself under DDP, a full-weight copy under
FSDP that ``sync_weights`` refreshes from the shards (``time/refresh``).
"""

from __future__ import annotations

import copy
import functools
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from turngym.trainer.config import TrainConfig
from turngym.trainer.distributed import DistContext, wrap_ddp
from turngym.trainer.optimizers import make_optimizer


def lr_schedule(kind: str, warmup: int, total: int) -> Callable[[int], float]:
    """The factor on the learning rate at an optimizer step: linear warm-up over ``warmup`` steps,
    then ``constant``, ``linear`` decay to 0 or ``cosine`` decay to 0 at ``total``."""

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if kind == "constant" or total <= warmup:
            return 1.0
        frac = min((step - warmup) / max(total - warmup, 1), 1.0)
        return 1.0 - frac if kind == "linear" else 0.5 * (1.0 + math.cos(math.pi * frac))

    return factor


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


class Policy:
    """The model being trained and everything that changes its weights or ships them."""

    def __init__(self, cfg: TrainConfig, dist: DistContext, model: Any = None, tokenizer: Any = None):
        """Load ``cfg.model`` (or take ``model``/``tokenizer`` as given: a benchmark's random-init
        model, already on this rank's device in its master dtype), then wrap or shard it."""
        import torch

        from turngym.agents.models import default_device, load_model, load_tokenizer

        self.cfg, self.dist = cfg, dist
        self.sharded = cfg.cluster.strategy == "fsdp" and dist.enabled
        if model is None:
            self.tokenizer = load_tokenizer(cfg.model.path)
            device = dist.device(cfg.model.device) or default_device()
            if cfg.model.gpu_memory_fraction is not None:
                cap_gpu_memory(cfg.model.gpu_memory_fraction, device)
            dtype = cfg.model.dtype
            if self.sharded and dtype is None:  # fp32 master shards; the layers compute in bf16 on CUDA
                dtype = "float32"
            model = load_model(cfg.model.path, device=device, dtype=dtype)
        else:
            self.tokenizer = tokenizer
        if cfg.model.gradient_checkpointing:  # per decoder layer; non-reentrant under FSDP
            kwargs = {"gradient_checkpointing_kwargs": {"use_reentrant": False}} if self.sharded else {}
            model.gradient_checkpointing_enable(**kwargs)
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
        self.full_copy: Any = None  # FSDP: the full-weight module rollouts and exports read
        if self.sharded:
            self.wrapped = self._shard(model)
        else:
            self.wrapped = wrap_ddp(self.model, dist)  # the update's forward; rollouts use self.model
        self.device = next(model.parameters()).device  # where the update's batches go
        if self.sharded:  # the mesh's device, also when the shards are offloaded to the CPU
            self.device = torch.device(dist.device(cfg.model.device) or default_device())
        if cfg.optim.logprob_kernel == "liger" and self.device.type == "cuda":
            from turngym.trainer.batching import liger_linear_cross_entropy

            liger_linear_cross_entropy()  # missing: an ImportError now, not at the first update
        self.refresh_seconds = 0.0  # the last full-copy refresh (FSDP)
        o = cfg.optim
        self.optimizer = make_optimizer(self.params(), o)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_schedule(o.schedule, o.warmup_steps, cfg.steps * o.ppo_epochs)
        )
        self.sync = self._weight_sync()
        self.adapter: str | None = None  # the LoRA adapter name the inference servers hold now

    def _shard(self, model: Any) -> Any:
        """FSDP2 over all ranks; the full copy is taken first, in the dtype the layers compute in."""
        from turngym.trainer.fsdp import FullWeights, compute_dtype, data_parallel_mesh, shard_model

        settings = self.cfg.cluster.fsdp
        device_type = next(model.parameters()).device.type
        dtype = compute_dtype(settings, next(model.parameters()).dtype, device_type)
        self.full_copy = FullWeights(model, dtype)
        return shard_model(model, data_parallel_mesh(self.dist), settings, device_type)

    @property
    def full_model(self) -> Any:
        """The module with the whole current weights on this rank: what rollouts generate from,
        credit scores with and exports save (the trained module itself unless it is sharded)."""
        return self.full_copy.module if self.full_copy is not None else self.model

    @functools.cached_property
    def num_params(self) -> int:
        """Parameters of the whole model (a sharded parameter counts its global size), for FLOP rates."""
        return sum(p.numel() for p in self.model.parameters())

    def release_full_weights(self) -> int:
        """FSDP with ``cluster.fsdp.release_full_copy``: free the full copy's trainable weights for the
        update (the refresh after it rebuilds them); the bytes freed (0 when nothing is released)."""
        if self.full_copy is None or not self.cfg.cluster.fsdp.release_full_copy:
            return 0
        return self.full_copy.release()

    def refresh_full_weights(self) -> float:
        """FSDP: gather the shards into the full copy (every rank); seconds taken (0 unsharded)."""
        if self.full_copy is None:
            return 0.0
        t0 = time.perf_counter()
        self.full_copy.refresh(self.model)
        self.refresh_seconds = time.perf_counter() - t0
        return self.refresh_seconds

    def params(self) -> list[Any]:
        """The parameters the optimizer trains (all, or the LoRA adapter's)."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def _weight_sync(self) -> Any:
        from turngym.trainer.weight_sync import InProcessSync, VLLMFullSync, VLLMLoRASync

        run_dir = self.cfg.run_dir
        if self.cfg.weight_sync == "vllm_lora":
            return VLLMLoRASync(self.cfg.vllm_urls, Path(run_dir) / "adapters")
        if self.cfg.weight_sync == "vllm_full":
            return VLLMFullSync(self.cfg.vllm_urls, Path(run_dir) / "weights")
        return InProcessSync()

    def sync_weights(self, step: int) -> None:
        """The full copy refreshed from the shards (FSDP, every rank); rank 0 pushes the weights to
        the inference side; every rank learns the adapter name."""
        self.refresh_full_weights()
        adapter = self.sync(self.full_model, step) if self.dist.is_main else None
        self.adapter = self.dist.broadcast(adapter)

    def load_trainable(self, weights: dict[str, Any]) -> None:
        """Load a trainable-weights state (a warm start's or a checkpoint's) into the model (and into
        the full copy, each rank locally: no collective)."""
        if self.full_copy is None:
            self.model.load_state_dict(weights, strict=False)
            return
        from turngym.trainer.fsdp import load_full_into_sharded

        load_full_into_sharded(self.model, weights)
        self.full_copy.module.load_state_dict(weights, strict=False)

    def clip_grad_norm(self) -> float:
        """Clip the gradients to ``optim.max_grad_norm``; their global norm (over shards too)."""
        from turngym.trainer.fsdp import clip_grad_norm

        comm = f"cuda:{self.dist.local_rank}" if self.dist.backend == "nccl" else "cpu"
        return clip_grad_norm(self.params(), self.cfg.optim.max_grad_norm, comm)
