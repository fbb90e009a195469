"""FSDP2 for the policy (``cluster.strategy: fsdp``): sharding a Hugging Face causal LM (or its peft
LoRA model) with ``torch.distributed.fsdp.fully_shard`` on a one-dimensional DeviceMesh, and the
full-weight copy that rollouts, credit scoring and exports read.

    mesh = data_parallel_mesh(dist)
    shard_model(model, mesh, cfg.cluster.fsdp, device_type="cuda")   # each decoder layer, then the root
    copy = FullWeights(model, dtype=torch.bfloat16)                 # made before sharding
    copy.refresh(model)                                             # after each update, on every rank

Sharding: one FSDP unit per decoder layer (the classes the model lists in ``_no_split_modules``),
then the root (embeddings, final norm, output head). The mixed-precision policy casts the gathered
parameters to ``param_dtype`` for compute and reduce-scatters gradients in ``reduce_dtype``; the
sharded parameters (the optimizer's master weights) keep the dtype the model was loaded in.

Every rank must run the same number of forward and backward passes (each one all-gathers every
layer): the update pads ranks with fewer micro-batches with zero-weight passes
(:func:`turngym.trainer.update.policy_update`), and gradients are reduce-scattered only on the last
pass of an optimizer step (:func:`gradient_sync`).

The full copy is a plain module on this rank's device; its trainable parameters are refreshed from
the shards one parameter at a time (``DTensor.full_tensor``: one all-gather each, so at most one
gathered parameter beyond the copy exists at a time) and cast into the copy's own buffers.
``copy.release()`` frees those buffers' memory for the update (``cluster.fsdp.release_full_copy``);
the next refresh allocates them again before filling them.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any

from turngym.trainer.distributed import DistContext


def _dtype(name: str | None) -> Any:
    import torch

    return None if name is None else getattr(torch, name)


def compute_dtype(settings: Any, model_dtype: Any, device_type: str) -> Any:
    """The dtype layers compute in: ``settings.param_dtype``, else bf16 on CUDA, else the model's."""
    import torch

    if settings.param_dtype is not None:
        return _dtype(settings.param_dtype)
    return torch.bfloat16 if device_type == "cuda" else model_dtype


def data_parallel_mesh(dist: DistContext) -> Any:
    """A one-dimensional DeviceMesh over all ranks (CUDA under NCCL, CPU under gloo)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cuda" if dist.backend == "nccl" else "cpu", (dist.world_size,))


def decoder_layers(model: Any) -> list[Any]:
    """The model's decoder layers (the module classes in its ``_no_split_modules``)."""
    names: set[str] = set()
    for mod in model.modules():
        names.update(getattr(mod, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"cannot shard {type(model).__name__} with FSDP: it names no decoder-layer class in "
            "_no_split_modules (a Hugging Face causal LM does)"
        )
    return layers


def shard_model(model: Any, mesh: Any, settings: Any, device_type: str) -> Any:
    """Apply FSDP2 in place: each decoder layer, then the root. Returns ``model`` (now an FSDPModule)."""
    import torch
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    model_dtype = next(model.parameters()).dtype
    mp = MixedPrecisionPolicy(
        param_dtype=compute_dtype(settings, model_dtype, device_type),
        reduce_dtype=_dtype(settings.reduce_dtype) or torch.float32,
    )
    offload = CPUOffloadPolicy(pin_memory=device_type == "cuda") if settings.cpu_offload else OffloadPolicy()
    for layer in decoder_layers(model):
        fully_shard(
            layer,
            mesh=mesh,
            mp_policy=mp,
            offload_policy=offload,
            reshard_after_forward=settings.reshard_after_forward,
        )
    fully_shard(model, mesh=mesh, mp_policy=mp, offload_policy=offload, reshard_after_forward=False)
    return model


def is_sharded(model: Any) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def gradient_sync(model: Any, last: bool) -> contextlib.AbstractContextManager:
    """FSDP: reduce-scatter gradients only in the last pass of an optimizer step (the others
    accumulate unsharded gradients locally). Set for the pass, so the next step starts synced."""
    model.set_requires_gradient_sync(last)
    return contextlib.nullcontext()


def clip_grad_norm(params: list[Any], max_norm: float, comm_device: str = "cpu") -> float:
    """Clip gradients to a global L2 norm of ``max_norm`` (as ``clip_grad_norm_``); returns the norm.

    Sharded (DTensor) gradients: each rank sums the squares of its own shard, one all-reduce on
    ``comm_device`` adds them up (so CPU-offloaded shards work under NCCL too), and every shard is
    scaled by the same factor. Plain gradients go through ``torch.nn.utils.clip_grad_norm_``."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    if not grads or not all(isinstance(g, DTensor) for g in grads):
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    local = [g.to_local() for g in grads]
    squares = torch.zeros((), dtype=torch.float64, device=comm_device)
    for g in local:
        squares += g.detach().double().pow(2).sum().to(comm_device)
    dist.all_reduce(squares)
    norm = float(squares.sqrt())
    coef = max_norm / (norm + 1e-6)
    if coef < 1.0:
        for g in local:
            g.mul_(coef)
    return norm


def _local(param: Any) -> Any:
    return param.to_local() if hasattr(param, "to_local") else param


def load_full_into_sharded(model: Any, weights: dict[str, Any]) -> None:
    """Copy full (unsharded) tensors into a sharded model's parameters and buffers, each rank taking
    its own shard locally (no collective: ranks may call this at different times)."""
    import torch
    from torch.distributed.tensor import DTensor, distribute_tensor

    params = dict(model.named_parameters())
    params.update(dict(model.named_buffers()))
    missing = sorted(set(weights) - set(params))
    if missing:
        raise ValueError(f"weights the model lacks: {missing[:5]}")
    with torch.no_grad():
        for name, full in weights.items():
            target = params[name]
            if isinstance(target, DTensor):
                full = full.to(device=target.device, dtype=target.dtype)
                piece = distribute_tensor(full, target.device_mesh, target.placements, src_data_rank=None)
                target.to_local().copy_(piece.to_local())
            else:
                target.copy_(full.to(device=target.device, dtype=target.dtype))


class FullWeights:
    """A full (unsharded) copy of the policy in ``dtype`` on the model's device, refreshed from the
    shards after each update. Make it before sharding; it keeps the model's structure (a peft
    model stays one), so rollouts and exports use it like the unsharded policy."""

    def __init__(self, model: Any, dtype: Any):
        import torch

        # each parameter is copied straight into ``dtype`` (no transient full copy in the master
        # dtype; tied parameters stay tied); buffers (rotary frequencies) keep their own dtype
        memo: dict[int, Any] = {
            id(p): torch.nn.Parameter(p.detach().to(dtype=dtype, copy=True), requires_grad=p.requires_grad)
            for p in model.parameters()
        }
        self.module = copy.deepcopy(model, memo).eval()
        self.released = False  # the trainable parameters' memory is freed until the next refresh

    def _trainable(self) -> list[Any]:
        return [p for p in self.module.parameters() if p.requires_grad]

    def release(self) -> int:
        """Free the memory of the copy's trainable parameters (their shapes stay; their values are
        gone until :meth:`refresh`); returns the bytes freed. Frozen parameters (a LoRA base) stay."""
        freed = 0
        for p in self._trainable():
            storage = p.untyped_storage()
            freed += storage.nbytes()
            storage.resize_(0)
        self.released = True
        return freed

    def refresh(self, sharded: Any) -> None:
        """Gather each trainable parameter from the shards into the copy (a collective: every rank
        calls it, in the same order). Frozen parameters never change, so they are not moved."""
        import torch

        if self.released:  # memory back first (new addresses), then every value is written below
            for p in self._trainable():
                p.untyped_storage().resize_(p.numel() * p.element_size())
            self.released = False
        own = dict(self.module.named_parameters())
        with torch.no_grad():
            for name, param in sharded.named_parameters():
                if name not in own or not param.requires_grad:
                    continue
                target = own[name]
                if hasattr(param, "full_tensor"):
                    if param.device != target.device:  # CPU-offloaded shards: gather on the copy's device
                        param = param.to(target.device)
                    full = param.full_tensor()
                else:
                    full = param
                target.copy_(full)
                del full
