"""Load tokenizers and causal LMs by local path or hub id, with one code path for both.

``"tiny"`` (or ``"tiny:thinking"``, ``"tiny:thinking_strip"``) resolves to a cached tiny random-init
model (``turngym.agents.tiny``); anything else goes to ``from_pretrained`` unchanged, so a local
checkpoint directory and a hub id load the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def resolve_model(name_or_path: str | Path) -> str:
    """``"tiny[:template]"`` -> the tiny model's directory; otherwise the argument itself."""
    name = str(name_or_path)
    if name == "tiny" or name.startswith("tiny:"):
        from turngym.agents.tiny import tiny_model_path

        template = name.partition(":")[2] or "chatml"
        return str(tiny_model_path(template=template))
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
