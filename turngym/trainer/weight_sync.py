"""Getting the trainer's new weights into the inference backend after each update.

* ``InProcessSync``: the HF backend generates with the very module being trained; nothing moves,
  the hook only records the policy version.
* ``VLLMLoRASync``: saves the LoRA adapter (peft) to ``adapters/step-N`` and hot-loads it into one or
  more vLLM servers through ``POST /v1/load_lora_adapter`` (servers started with
  ``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``); the previous adapter is unloaded.
  The agent then requests the new adapter by name.
"""

from __future__ import annotations

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
    timeout: float = 120.0
    keep: int = 2
    loaded: list[str] = field(default_factory=list)

    def __call__(self, model: Any, step: int) -> str:
        import httpx

        name = f"{self.prefix}-{step}"
        path = Path(self.adapter_dir) / f"step-{step:06d}"
        model.save_pretrained(path)  # a peft model saves only its adapter
        for url in self.urls:
            base = url.rstrip("/").removesuffix("/v1")
            resp = httpx.post(
                f"{base}/v1/load_lora_adapter",
                json={"lora_name": name, "lora_path": str(path.resolve())},
                timeout=self.timeout,
            )
            if resp.status_code != 200:
                raise WeightSyncError(
                    f"{base}: loading adapter {name} failed ({resp.status_code}): {resp.text[:500]}"
                )
        self.loaded.append(name)
        while len(self.loaded) > self.keep:
            old = self.loaded.pop(0)
            for url in self.urls:
                base = url.rstrip("/").removesuffix("/v1")
                httpx.post(f"{base}/v1/unload_lora_adapter", json={"lora_name": old}, timeout=self.timeout)
        return name
