"""Host cost of PyTorch's SDPA kernel choices for a continuous batch's decode steps, on CUDA.

    python benchmarks/attention_kernels.py            # every choice, each in a fresh process
    python benchmarks/attention_kernels.py default    # one: default | no-cudnn | cudnn

A 12-layer, 76M-parameter random Qwen2 (the GPU model of ``benchmarks/rollout.py``) in bf16 decodes
40 steps at batch 64 after a 128-token prefill, with a padded 2-D attention mask (as the HF
backend's batch has) and without; then the same 40 steps again. Printed: the median step time (ms,
after a device sync) on shapes met for the first time and on shapes already seen. cuDNN's kernel
builds an execution plan per new (batch, query, key) shape; a continuous batch meets new shapes
nearly every pass. ``HFBackend`` passes on CUDA therefore run without it (``cudnn_attention=False``).
Without CUDA it prints a skip line.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CHOICES = ("default", "no-cudnn", "cudnn")


def measure(choice: str, batch: int = 64, context: int = 128, steps: int = 40) -> dict:
    import torch
    from rollout import model_path
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers import AutoModelForCausalLM

    kernels = {
        "default": None,
        "no-cudnn": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
        "cudnn": [SDPBackend.CUDNN_ATTENTION],
    }[choice]
    model = AutoModelForCausalLM.from_pretrained(model_path("cuda"), dtype=torch.bfloat16).to("cuda").eval()
    ids = torch.randint(10, 1000, (batch, context), device="cuda")
    pad = torch.ones((batch, context), dtype=torch.long, device="cuda")
    pad[::2, : context // 8] = 0  # every other row left-padded

    def run(masked: bool) -> float:
        times = []
        with torch.inference_mode():
            mask = pad if masked else None
            out = model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1)
            cache, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            torch.cuda.synchronize()
            for _ in range(steps):
                if masked:
                    mask = torch.cat([mask, mask.new_ones((batch, 1))], 1)
                t0 = time.perf_counter()
                out = model(input_ids=nxt, attention_mask=mask, past_key_values=cache, logits_to_keep=1)
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
        return round(1000 * sorted(times)[len(times) // 2], 2)

    res: dict = {"kernels": choice, "device": torch.cuda.get_device_name(0), "batch": batch}
    for masked in (True, False):
        with sdpa_kernel(kernels) if kernels else contextlib.nullcontext():
            res[f"{'masked' if masked else 'no_mask'}_new_shapes_ms"] = run(masked)
            res[f"{'masked' if masked else 'no_mask'}_seen_shapes_ms"] = run(masked)
    return res


def main() -> None:
    import torch

    if not torch.cuda.is_available():
        print("attention_kernels: skipped (no CUDA device)")
        return
    if len(sys.argv) > 1:
        print(json.dumps(measure(sys.argv[1])), flush=True)
        return
    for choice in CHOICES:  # a fresh process each: cuDNN's plan cache lives as long as the process
        subprocess.run([sys.executable, __file__, choice], check=False)


if __name__ == "__main__":
    main()
