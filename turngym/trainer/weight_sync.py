"""Getting the trainer's new weights into the inference backend after each update.

* ``InProcessSync``: the HF backend generates with the very module being trained; nothing moves,
  the hook only records the policy version.
* ``VLLMLoRASync``: saves the LoRA adapter (peft) to ``adapters/step-N`` and hot-loads it into one or
  more vLLM servers through ``POST /v1/load_lora_adapter`` (servers started with
  ``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``); the previous adapter is unloaded.
  The agent then requests the new adapter by name.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class WeightSyncError(RuntimeError):
    pass


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
        from turngym.agents.vllm import VLLMBackend

        if not hasattr(model, "peft_config"):
            raise WeightSyncError("vllm_lora weight sync needs a peft (LoRA) model")
        name = f"{self.prefix}-{step}"
        path = (Path(self.adapter_dir) / f"step-{step:06d}").resolve()
        model.save_pretrained(path)  # a peft model saves only its adapter
        stale = self.loaded[-self.keep + 1 :] if self.keep > 1 else []
        drop = [n for n in self.loaded if n not in stale]

        async def push() -> None:
            backend = VLLMBackend(self.urls)
            try:
                await backend.load_lora_adapter(name, path, replace=True)
                for old in drop:
                    await backend.unload_lora_adapter(old)
            finally:
                await backend.aclose()

        try:
            asyncio.run(push())
        except Exception as e:  # noqa: BLE001 - re-raised with what failed
            raise WeightSyncError(f"loading adapter {name} from {path} into {self.urls} failed: {e}") from e
        self.loaded = [*stale, name]
        return name
