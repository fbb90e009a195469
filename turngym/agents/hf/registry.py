"""The HF backend's engines, by name: which scheduler runs a transformers model in-process.

* ``continuous`` (``HFBackend``): a growing, left-padded KV cache; every pass eager. Any model
  transformers can cache, on CPU or GPU.
* ``slots`` (``HFSlotBackend``): fixed KV slots, decode steps replayed as CUDA graphs on a GPU
  (eager on CPU). Full-attention decoders.
* ``auto``: ``slots`` when the model runs on CUDA, else ``continuous``; ``make_hf_backend`` also
  falls back to ``continuous`` (with a warning) when the slots cannot serve the model there (KV
  slots over half the free device memory, attention they do not support).

``hf_backend_class("auto", device)`` returns the class; ``register_hf_engine`` adds one
(``"module:Class"``, imported on first use). ``COMPILE_SETTINGS``: the named ``torch.compile``
settings of engines that compile their decode step (``slots``; the ``compile`` option).
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

log = logging.getLogger(__name__)

HF_ENGINES: dict[str, str] = {
    "continuous": "turngym.agents.hf.engine:HFBackend",
    "slots": "turngym.agents.hf.slots:HFSlotBackend",
}
ENGINE_CHOICES = ("auto", *HF_ENGINES)

# ``compile``'s named settings: torch.compile arguments. Never a mode with inductor's own CUDA graphs
# ("reduce-overhead", "max-autotune"): the backend captures the compiled step in its own graph.
COMPILE_SETTINGS: dict[str, dict[str, Any]] = {
    "default": {"mode": "default", "dynamic": False},
    "max-autotune-no-cudagraphs": {"mode": "max-autotune-no-cudagraphs", "dynamic": False},
    "dynamic": {"mode": "default", "dynamic": True},
}


def compile_setting(compile: bool | str | None) -> str | None:
    """The name in ``COMPILE_SETTINGS`` that ``compile`` stands for (``True``: ``default``; ``None``,
    ``False``, ``""``, ``"off"``, ``"none"``: off, None); other names raise ``ValueError``."""
    if compile is None or compile is False or str(compile).lower() in ("", "off", "none", "false"):
        return None
    name = "default" if compile is True or str(compile).lower() == "true" else str(compile)
    if name not in COMPILE_SETTINGS:
        raise ValueError(
            f"unknown compile setting {compile!r}; choose from {', '.join(COMPILE_SETTINGS)} (or off)"
        )
    return name


def register_hf_engine(name: str, target: str) -> None:
    """Make ``name`` an HF engine; ``target`` is ``"module:Class"`` (an ``HFBackend`` subclass)."""
    if name == "auto" or ":" not in target:
        raise ValueError(
            f"register_hf_engine({name!r}, {target!r}): use a name other than 'auto' and 'module:Class'"
        )
    HF_ENGINES[name] = target


def resolve_hf_engine(engine: str, device: Any = None, model: Any = None) -> str:
    """The engine ``auto`` stands for: ``slots`` on CUDA (``device``, else the model object's
    device, else CUDA if present), ``continuous`` elsewhere. Unknown names raise ``ValueError``."""
    if engine != "auto":
        if engine not in HF_ENGINES:
            raise ValueError(f"unknown HF engine {engine!r}; choose from {', '.join(ENGINE_CHOICES)}")
        return engine
    if device is None and model is not None and hasattr(model, "parameters"):
        device = next(model.parameters()).device
    if device is None:
        from turngym.agents.models import default_device

        device = default_device()
    return "slots" if str(device).startswith("cuda") else "continuous"


def hf_backend_class(engine: str = "auto", device: Any = None, model: Any = None) -> type:
    """The backend class of an engine name (see ``resolve_hf_engine``)."""
    module, _, cls = HF_ENGINES[resolve_hf_engine(engine, device, model)].partition(":")
    return getattr(importlib.import_module(module), cls)


def make_hf_backend(
    model: Any,
    tokenizer: Any = None,
    *,
    engine: str = "auto",
    max_context: int | None = None,
    compile: bool | str | None = None,
    **kwargs: Any,
) -> Any:
    """An in-process HF backend of ``engine``; ``max_context`` sizes the KV slots of engines that
    have them (``slots``) and is ignored by the others; ``compile`` (``torch.compile`` of the decode
    step, see ``COMPILE_SETTINGS``) goes to engines that compile (``slots``),
    others ignore it with a warning. Other arguments go to the constructor."""
    cls = hf_backend_class(engine, kwargs.get("device"), model)
    if max_context is not None and getattr(cls, "sized_context", False):
        kwargs["max_context"] = max_context
    setting = compile_setting(compile)
    if setting is not None:
        if getattr(cls, "compiles", False):
            kwargs["compile"] = setting
        else:
            log.warning("the %s engine does not compile its steps; compile=%r ignored", cls.__name__, setting)
    try:
        return cls(model, tokenizer, **kwargs)
    except ValueError as e:  # auto: slots that do not fit the device, or a model they cannot serve
        if engine != "auto" or not getattr(cls, "sized_context", False):
            raise
        log.warning("the slots engine cannot serve here (%s); using the continuous engine", e)
        kwargs.pop("max_context", None)
        kwargs.pop("compile", None)
        loaded, tok = (
            getattr(e, "model", None),
            getattr(e, "tokenizer", None),
        )  # set by HFSlotBackend when it refuses a model
        if loaded is not None:
            model, tokenizer = loaded, tok
            for loading_only in ("dtype", "device", "attn_implementation"):  # the model is loaded
                kwargs.pop(loading_only, None)
        return hf_backend_class("continuous")(model, tokenizer, **kwargs)
