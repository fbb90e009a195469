"""The card's two phases and what each may take of it (``memory``): the rollout (the policy's weights,
the optimizer state that lives on, the rollout engine's KV slots) and the update (weights, gradients,
optimizer state, and the KV slots unless the engine sleeps through it: ``rollout.sleep_during_update``).

    memory:
      rollout_fraction: 0.4    # of the card's bytes; null: not checked
      update_fraction: 0.9

At start (``Trainer.setup``) :func:`check_memory_budget` adds up the bytes each phase holds for its
whole length, from the loaded policy's own tensors and the engine's settings (``PhaseBytes``), and an
over-budget setting stops the run there with every number (weights, gradients, optimizer state, KV
slots, the card) and the knobs that move them. Activations, logits, gathered FSDP layers and the
graphs' pools come on top of these static bytes: the fractions are ceilings for the static part.
No device with a size (CPU): nothing to check, unless ``card_bytes`` is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# ``TrainConfig`` (whose ``memory`` section is defined here) and ``Policy`` are not imported, not even
# for typing: the config imports this module.
TrainConfig = Policy = Any


class MemorySettings(BaseModel):
    """``memory``: the share of the card each phase may hold (static bytes; None: not checked)."""

    model_config = ConfigDict(extra="forbid")

    rollout_fraction: float | None = Field(default=None, gt=0.0, le=1.0)
    update_fraction: float | None = Field(default=None, gt=0.0, le=1.0)


class MemoryBudgetError(ValueError):
    """A phase's static bytes exceed its share of the card (``memory.*_fraction``)."""


@dataclass(frozen=True)
class PhaseBytes:
    """What one rank holds for a whole phase, in bytes; ``card``: the device's total (None: unknown)."""

    weights: int  # every module's parameters held here (shards, the rollouts' full copy, a reference)
    grads: int  # one per trainable (local) parameter, during the update
    optimizer: int  # the optimizer's state, through both phases
    kv: int  # the slots engine's KV slots (0: no in-process slots engine)
    sleeping: bool  # the engine gives its KV back for the update
    card: int | None

    @property
    def rollout(self) -> int:
        return self.weights + self.optimizer + self.kv

    @property
    def update(self) -> int:
        return self.weights + self.grads + self.optimizer + (0 if self.sleeping else self.kv)


def check_sleep_settings(cfg: TrainConfig) -> None:
    """``rollout.sleep_during_update`` needs an in-process backend to put to sleep, and its ``kv``
    level (graphs kept) cannot outlive the full copy's weights that ``release_full_copy`` frees."""
    r = cfg.rollout
    if not r.sleep_during_update:
        return
    if cfg.weight_sync != "in_process":
        raise ValueError(
            f"rollout.sleep_during_update puts the in-process engine to sleep; with weight_sync="
            f"{cfg.weight_sync} the rollouts run on vLLM servers (use their own sleep mode there)"
        )
    if cfg.cluster.fsdp.release_full_copy and r.sleep_level == "kv":
        raise ValueError(
            "rollout.sleep_level=kv keeps CUDA graphs that read the full copy's weights, which "
            "cluster.fsdp.release_full_copy frees during the update: use sleep_level kv+graphs"
        )


#: why ``rollout.sleep_during_update`` is refused on CUDA for now (measured, benchmarks/gpu_results.md)
SLEEP_ON_CUDA_UNVERIFIED = (
    "rollout.sleep_during_update is refused on CUDA: on an H200 the slots engine's greedy tokens after "
    "sleep() and wake() differed from those before (tests/agents/test_hf_slots_sleep.py, GPU cases), so "
    "it would train on wrong rollouts. Leave it off: with rollout.keep_backend false (the default) the "
    "engine's KV slots and graphs are freed after every rollout anyway, and made again at the next one"
)


def check_sleep_device(cfg: TrainConfig, device: Any) -> None:
    """Refuse ``rollout.sleep_during_update`` where its wake is not known to give the engine back
    intact (CUDA, see :data:`SLEEP_ON_CUDA_UNVERIFIED`)."""
    if cfg.rollout.sleep_during_update and getattr(device, "type", str(device)).startswith("cuda"):
        raise ValueError(SLEEP_ON_CUDA_UNVERIFIED)


def _local(p: Any) -> Any:
    return p.to_local() if hasattr(p, "to_local") else p


def _bytes(tensors: Any, device_type: str) -> int:
    """Bytes of the distinct tensors' local parts that live on a device of ``device_type`` (shards
    offloaded to the host, ``cluster.fsdp.cpu_offload``, are not on the card)."""
    seen: dict[int, int] = {}
    for t in tensors:
        local = _local(t)
        if local.device.type == device_type:
            seen[id(t)] = local.numel() * local.element_size()
    return sum(seen.values())


def engine_kv_bytes(cfg: TrainConfig, model: Any) -> int:
    """The KV slots an in-process slots engine (``hf_engine`` slots, or auto on CUDA) takes for
    ``model`` at the rollout's settings; 0 for the continuous engine and vLLM servers."""
    from turngym.agents.hf.kv.slots import kv_cache_bytes

    spec = cfg.backend_spec()
    device = next(model.parameters()).device
    slots = spec.hf_engine == "slots" or (spec.hf_engine == "auto" and device.type == "cuda")
    if spec.kind != "hf" or not slots:
        return 0
    return kv_cache_bytes(model, spec.max_batch_size, spec.max_context + 1)


def phase_bytes(cfg: TrainConfig, policy: Policy, card_bytes: int | None = None) -> PhaseBytes:
    """The static bytes of each phase on this rank for the loaded ``policy`` (see the module doc);
    ``card_bytes``: the device's size (default: the CUDA device's total memory, None elsewhere)."""
    from turngym.trainer.optimizers import state_bytes_per_param

    kind = policy.device.type
    modules = [policy.model, policy.full_model, policy.ref_model]
    weights = _bytes((p for m in modules if m is not None for p in m.parameters()), kind)
    # gradients and optimizer state live where the trained (local) parameters do
    trainable = [t for t in map(_local, policy.params()) if t.device.type == kind]
    grads = sum(p.numel() * p.element_size() for p in trainable)
    fsdp = cfg.cluster.fsdp
    if policy.sharded and not fsdp.reduce_every_micro_batch:
        # between a step's micro-batches FSDP2 keeps the whole model's unsharded gradient in the
        # reduce dtype (measured: 28.4 GiB more at 7B, docs/scaling.md 4c), unless each is reduced at once
        from turngym.trainer.optimizers import DTYPE_BYTES

        grads += sum(p.numel() for p in policy.params()) * DTYPE_BYTES[fsdp.reduce_dtype]
    master = str(trainable[0].dtype).removeprefix("torch.") if trainable else "float32"
    per_param = state_bytes_per_param(cfg.optim.optimizer, master)
    optimizer = int(sum(p.numel() for p in trainable) * per_param)
    if card_bytes is None and policy.device.type == "cuda":
        import torch

        card_bytes = int(torch.cuda.get_device_properties(policy.device).total_memory)
    return PhaseBytes(
        weights=weights,
        grads=grads,
        optimizer=optimizer,
        kv=engine_kv_bytes(cfg, policy.full_model),
        sleeping=cfg.rollout.sleep_during_update,
        card=card_bytes,
    )


def _size(n: float) -> str:
    return f"{n / 2**30:.2f} GiB = {int(n):,} B"


def check_memory_budget(cfg: TrainConfig, policy: Policy, card_bytes: int | None = None) -> PhaseBytes | None:
    """Refuse (``MemoryBudgetError``, with the numbers) a run whose phases' static bytes exceed
    ``memory.rollout_fraction`` / ``update_fraction`` of the card; the bytes, or None when no
    fraction is set or the card's size is unknown."""
    m = cfg.memory
    if m.rollout_fraction is None and m.update_fraction is None:
        return None
    b = phase_bytes(cfg, policy, card_bytes)
    if b.card is None:
        return None
    kv_in_update = "0 (the engine sleeps)" if b.sleeping else _size(b.kv)
    phases = [
        ("rollout", m.rollout_fraction, b.rollout, f"weights + optimizer state + KV slots {_size(b.kv)}"),
        (
            "update",
            m.update_fraction,
            b.update,
            f"weights + gradients + optimizer state + KV slots {kv_in_update}",
        ),
    ]
    over = [(name, f, total, what) for name, f, total, what in phases if f is not None and total > f * b.card]
    if not over:
        return b
    lines = [
        f"the {name} phase needs {_size(total)} ({what}), over memory.{name}_fraction = {f} of the card "
        f"({_size(f * b.card)})"
        for name, f, total, what in over
    ]
    raise MemoryBudgetError(
        "the memory budget does not fit this card:\n  "
        + "\n  ".join(lines)
        + f"\n  card {_size(b.card)}; weights {_size(b.weights)}, gradients {_size(b.grads)}, optimizer state "
        f"{_size(b.optimizer)} (optim.optimizer = {cfg.optim.optimizer}), KV slots {_size(b.kv)} "
        f"(rollout.backend.max_batch_size x rollout.max_context + 1 tokens)\n"
        "  static bytes only: activations, logits and CUDA graphs come on top. Turn one: lower "
        "rollout.backend.max_batch_size or rollout.max_context (KV slots), rollout.sleep_during_update: true "
        "(no KV slots in the update; CPU only for now), cluster.fsdp.reduce_every_micro_batch: true (no "
        "unsharded gradients between micro-batches), optim.optimizer: adamw_8bit (state), cluster.strategy: fsdp on more "
        "GPUs (weights, gradients, state), model.lora (gradients, state), or raise the fraction"
    )
