"""The policy role of the trainer: the trained model, its tokenizer, its reference, its sharding across
ranks (DDP today), the optimizer and learning-rate schedule, and pushing weights to inference.

    policy = Policy(cfg, dist)          # loads the model, wraps it, builds AdamW and the schedule
    policy.sync_weights(step)           # rank 0 pushes to the inference side; all ranks learn the adapter

The update (:mod:`turngym.trainer.update`) runs its forward through ``policy.wrapped`` (the DDP
module, or the model itself in one process); rollouts generate from ``policy.model``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from turngym.trainer.config import TrainConfig
from turngym.trainer.distributed import DistContext, wrap_ddp


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

    def __init__(self, cfg: TrainConfig, dist: DistContext):
        import torch

        from turngym.agents.models import default_device, load_model, load_tokenizer

        self.cfg, self.dist = cfg, dist
        self.tokenizer = load_tokenizer(cfg.model.path)
        device = dist.device(cfg.model.device) or default_device()
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
        self.wrapped = wrap_ddp(self.model, dist)  # the update's forward; rollouts use self.model
        self.device = next(model.parameters()).device
        o = cfg.optim
        self.optimizer = torch.optim.AdamW(self.params(), lr=o.lr, betas=o.betas, weight_decay=o.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_schedule(o.schedule, o.warmup_steps, cfg.steps * o.ppo_epochs)
        )
        self.sync = self._weight_sync()
        self.adapter: str | None = None  # the LoRA adapter name the inference servers hold now

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
        """Rank 0 pushes the weights to the inference side; every rank learns the adapter name."""
        adapter = self.sync(self.model, step) if self.dist.is_main else None
        self.adapter = self.dist.broadcast(adapter)

    def load_trainable(self, weights: dict[str, Any]) -> None:
        """Load a trainable-weights state (a warm start's or a checkpoint's) into the model."""
        self.model.load_state_dict(weights, strict=False)
