"""The learner's optimizer (``optim.optimizer``) and what each choice costs in memory.

    opt = make_optimizer(params, cfg.optim)           # torch's AdamW, or torchao's quantized-state AdamW
    state_bytes_per_param("adamw_8bit", "float32")    # 2.03...: the two moments of one parameter
    static_bytes_per_param(world=2, optimizer="adamw_8bit", release_full_copy=True)   # per rank

``adamw`` is ``torch.optim.AdamW``: its two moments have the parameters' dtype (8 bytes a parameter
for fp32 master weights). ``adamw_8bit`` and ``adamw_4bit`` are ``torchao.optim.AdamW8bit`` /
``AdamW4bit``: each moment is stored block-wise quantized (one code a value, one fp32 scale per
block), dequantized to fp32 for the step; tensors under 4096 values (or not a whole number of blocks)
keep plain moments. They work on FSDP2's sharded (DTensor) parameters; their step is
``torch.compile``d per parameter shape (the first step compiles).
"""

from __future__ import annotations

from typing import Any

#: the quantized-state optimizers ``optim.optimizer`` names: (torchao class, block size, bytes a code)
QUANTIZED = {"adamw_8bit": ("AdamW8bit", 256, 1.0), "adamw_4bit": ("AdamW4bit", 128, 0.5)}

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def state_bytes_per_param(optimizer: str, master_dtype: str) -> float:
    """Bytes of optimizer state per (large) parameter: two moments, each a code per value plus an
    fp32 scale per block for the quantized ones, or two values of the master dtype for torch's."""
    if optimizer == "adamw":
        return 2.0 * DTYPE_BYTES[master_dtype]
    _, block, code_bytes = QUANTIZED[optimizer]
    return 2.0 * (code_bytes + 4.0 / block)


def static_bytes_per_param(
    world: int,
    optimizer: str = "adamw",
    master_dtype: str = "float32",
    sharded: bool = True,
    copy_dtype: str = "bfloat16",
    release_full_copy: bool = False,
    accumulate_unsharded: bool = False,
    reduce_dtype: str = "float32",
) -> dict[str, float]:
    """Bytes per parameter of the whole model that one rank holds, apart from activations, logits
    and the one parameter being gathered: the master weights, their gradients and the optimizer state
    (divided by ``world`` when sharded); under FSDP the rollouts' full copy, and, when gradients
    accumulate over micro-batches without a reduce-scatter between them, FSDP2's whole-model
    unsharded gradient in ``reduce_dtype``.

    Two phases: ``update`` (forward/backward and the optimizer step) and ``refresh`` (the copy
    gathered from the shards after it). With ``release_full_copy`` the copy is absent from the
    update and the gradients are freed before the refresh; ``total`` is the larger phase."""
    master = DTYPE_BYTES[master_dtype]
    div = world if sharded else 1
    out = {
        "master": master / div,
        "grads": master / div,
        "state": state_bytes_per_param(optimizer, master_dtype) / div,
        "full_copy": float(DTYPE_BYTES[copy_dtype]) if sharded else 0.0,
        "unsharded_grads": float(DTYPE_BYTES[reduce_dtype]) if sharded and accumulate_unsharded else 0.0,
    }
    shared = out["master"] + out["state"]
    copy_in_update = 0.0 if release_full_copy else out["full_copy"]
    out["update"] = shared + out["grads"] + out["unsharded_grads"] + copy_in_update
    out["refresh"] = shared + out["full_copy"] + (0.0 if release_full_copy else out["grads"])
    out["total"] = max(out["update"], out["refresh"])
    return out


def state_tensor_classes() -> list[type]:
    """torchao's quantized-state tensor classes, which a checkpoint of their optimizer holds: the
    classes ``torch.load(weights_only=True)`` may rebuild (none when torchao is not installed)."""
    try:
        from torchao.optim.subclass_4bit import OptimState4bit
        from torchao.optim.subclass_8bit import OptimState8bit
    except ImportError:
        return []
    return [OptimState8bit, OptimState4bit]


def is_quantized(optimizer: Any) -> bool:
    """Whether ``optimizer`` keeps torchao's quantized state (``adamw_8bit``/``adamw_4bit``)."""
    return type(optimizer).__name__ in {name for name, _, _ in QUANTIZED.values()} and type(
        optimizer
    ).__module__.startswith("torchao")


def make_optimizer(params: list[Any], optim: Any) -> Any:
    """The optimizer ``optim.optimizer`` names over ``params`` (lr, betas, weight decay from ``optim``)."""
    import torch

    kwargs = {"lr": optim.lr, "betas": tuple(optim.betas), "weight_decay": optim.weight_decay}
    if optim.optimizer == "adamw":
        return torch.optim.AdamW(params, **kwargs)
    try:
        import torchao.optim
    except ImportError as e:
        raise ImportError(
            f"optim.optimizer={optim.optimizer} needs torchao (pip install 'turngym[train]'): {e}"
        ) from e
    name, block, _ = QUANTIZED[optim.optimizer]
    return getattr(torchao.optim, name)(params, block_size=block, **kwargs)
