"""Getting the trainer's new weights into the inference backend after each update.

* ``InProcessSync``: the HF backend generates with the very module being trained; nothing moves,
  the hook only records the policy version.
* ``VLLMLoRASync``: saves the LoRA adapter (peft) to ``adapters/step-N`` and hot-loads it into one or
  more vLLM servers through ``POST /v1/load_lora_adapter`` (servers started with
  ``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``); the previous adapter is unloaded.
  The agent then requests the new adapter by name.
* ``VLLMFullSync``: saves the full model to ``weights/step-N`` (written aside, then renamed into place)
  and has every vLLM server reload its weights in place from there (``VLLMBackend.reload_weights``:
  vLLM's ``reload_weights`` through ``POST /collective_rpc``; servers started with
  ``VLLM_SERVER_DEV_MODE=1`` and able to read the trainer's disk); older snapshots are removed.
  Models with tied input/output embeddings are refused: vLLM's in-place reload leaves a tied
  lm_head stale.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class WeightSyncError(RuntimeError):
    pass


def on_servers(urls: list[str], action: Callable[[Any], Awaitable[None]], what: str) -> None:
    """Run ``action(backend)`` with a ``VLLMBackend`` over ``urls``; failures become ``WeightSyncError``."""
    from turngym.agents.vllm import VLLMBackend

    async def go() -> None:
        backend = VLLMBackend(urls)
        try:
            await action(backend)
        finally:
            await backend.aclose()

    try:
        asyncio.run(go())
    except Exception as e:  # noqa: BLE001 - re-raised with what failed
        raise WeightSyncError(f"{what} into {urls} failed: {e}") from e


@dataclass
class InProcessSync:
    """The backend shares the trained module: weights are always current."""

    version: int = 0

    def __call__(self, model: Any, step: int) -> str | None:
        self.version = step
        return None


@dataclass
class VLLMLoRASync:
    """Hot-load the current LoRA adapter into vLLM servers; returns the adapter name to request."""

    urls: list[str]
    adapter_dir: Path
    prefix: str = "policy"
    keep: int = 2
    loaded: list[str] = field(default_factory=list)

    def __call__(self, model: Any, step: int) -> str:
        if not hasattr(model, "peft_config"):
            raise WeightSyncError("vllm_lora weight sync needs a peft (LoRA) model")
        name = f"{self.prefix}-{step}"
        path = (Path(self.adapter_dir) / f"step-{step:06d}").resolve()
        model.save_pretrained(path)  # a peft model saves only its adapter
        stale = self.loaded[-self.keep + 1 :] if self.keep > 1 else []
        drop = [n for n in self.loaded if n not in stale]

        async def push(backend) -> None:
            await backend.load_lora_adapter(name, path, replace=True)
            for old in drop:
                await backend.unload_lora_adapter(old)

        on_servers(self.urls, push, f"loading adapter {name} from {path}")
        self.loaded = [*stale, name]
        return name


@dataclass
class VLLMFullSync:
    """Reload the full trained weights into vLLM servers from a snapshot on a shared disk."""

    urls: list[str]
    weights_dir: Path
    keep: int = 1
    pushed: list[Path] = field(default_factory=list)

    def __call__(self, model: Any, step: int) -> None:
        if hasattr(model, "peft_config"):
            raise WeightSyncError("vllm_full weight sync pushes a full model; use vllm_lora for a peft model")
        if getattr(model.config, "tie_word_embeddings", False):
            raise WeightSyncError(
                "vllm_full weight sync needs an untied lm_head: vLLM's in-place reload_weights puts a tied "
                "lm_head's old tensor back (vLLM 0.32 logs 'ParallelLMHead: Failed to load weights'), so the "
                "server would decode with stale output embeddings; use vllm_lora, or untie the embeddings"
            )
        path = (Path(self.weights_dir) / f"step-{step:06d}").resolve()
        tmp = path.with_name(path.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp)  # servers never see a half-written snapshot
        shutil.rmtree(path, ignore_errors=True)
        tmp.rename(path)

        on_servers(self.urls, lambda backend: backend.reload_weights(path), f"reloading weights from {path}")
        self.pushed = [p for p in self.pushed if p != path] + [path]
        while len(self.pushed) > max(self.keep, 1):
            shutil.rmtree(self.pushed.pop(0), ignore_errors=True)
