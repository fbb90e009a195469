"""Load tokenizers and causal LMs by local path or hub id, with one code path for both.

``"tiny"`` (or ``"tiny:thinking"``, ``"tiny:thinking_strip"``) resolves to a cached tiny random-init
model (``turngym.agents.tiny``); a registered pretrained name (``"smollm2-135m"``, see
``turngym.agents.pretrained`` and ``turngym models``) to its converted folder; anything else goes to
``from_pretrained`` unchanged, so a local checkpoint directory and a hub id load the same way.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

_log = logging.getLogger("turngym.models")


def resolve_model(name_or_path: str | Path) -> str:
    """``"tiny[:template]"`` -> the tiny model's directory; a pretrained name -> its converted folder
    (converted on first use); otherwise the argument itself."""
    name = str(name_or_path)
    if name == "tiny" or name.startswith("tiny:"):
        from turngym.agents.tiny import tiny_model_path

        template = name.partition(":")[2] or "chatml"
        return str(tiny_model_path(template=template))
    from turngym.agents.pretrained import is_pretrained_name, resolve_pretrained

    if is_pretrained_name(name) and not Path(name).exists():
        return str(resolve_pretrained(name, log=_log.info))
    return name


def load_tokenizer(name_or_path: str | Path, **kwargs: Any) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model(name_or_path), **kwargs)


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_model(
    name_or_path: str | Path,
    *,
    device: str | None = None,
    dtype: Any = None,
    attn_implementation: str | None = None,
    **kwargs: Any,
) -> Any:
    """A causal LM in eval mode on ``device`` (default: CUDA if present); bf16 on GPU, fp32 on CPU."""
    import torch
    from transformers import AutoModelForCausalLM

    device = device or default_device()
    if dtype is None:
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    elif isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    model = AutoModelForCausalLM.from_pretrained(resolve_model(name_or_path), dtype=dtype, **kwargs)
    return model.to(device).eval()
