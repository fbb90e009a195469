"""The fast forward's Triton kernels (``turngym.agents.hf_triton``): attention over the slots,
rotary with the cache write and SwiGLU equal their torch references on random shapes (grouped
heads, one or many queries a row, slots out of order, strided queries, positions at 0 and past the
attended columns), and the slots engine with them gives the torch ops' greedy ids, logprobs and
seeded samples on Llama, Mistral and Qwen2 across resumed turns; both on CPU through Triton's
interpreter (float32, float16), in a subprocess since triton reads ``TRITON_INTERPRET`` at import.
Which kernels a forward uses, and the refusals. On CUDA (bf16, captured graphs): test_hf_cuda.py."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from turngym.agents import hf_triton
from turngym.agents.hf_fast import FastForward
from turngym.agents.hf_slots import HFSlotBackend

ROOT = Path(__file__).resolve().parents[2]
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")


def _interpret(check: str) -> str:
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "2"}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.triton_checks", check],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@needs_triton
def test_kernels_equal_their_references_in_the_interpreter():
    out = _interpret("kernels")
    assert "ok sample:" in out
    for name in ("attention", "rotary_write", "swiglu"):
        for dtype in ("float32", "float16"):
            assert f"ok {name} torch.{dtype}" in out


@needs_triton
@pytest.mark.slow
def test_slots_engine_with_the_kernels_equals_torch_ops_in_the_interpreter():
    out = _interpret("engine")
    assert [line for line in out.splitlines() if line.startswith("ok engine")] == [
        "ok engine llama",
        "ok engine mistral",
        "ok engine qwen2",
    ]


def test_kernel_choice_and_refusals(tiny_dir, tokenizer):
    backend = HFSlotBackend(tiny_dir, tokenizer, max_batch_size=2, max_context=64)
    assert backend._fast.kernels == "torch"  # CPU: the compiled kernels need CUDA
    assert "not CUDA" in backend._fast.kernels_problem
    with pytest.raises(ValueError, match="kernels='triton', but the Triton kernels cannot run"):
        FastForward(backend.model, 65, kernels="triton")
    with pytest.raises(ValueError, match="kernels must be one of"):
        HFSlotBackend(tiny_dir, tokenizer, max_batch_size=2, max_context=64, kernels="cuda")
    assert "head_dim 80" in hf_triton.problem("cuda", 80)
    assert "head_dim 8" in hf_triton.problem("cuda", 8)
    q = backend.model.lm_head.weight.new_zeros(2, 2, 64)
    with pytest.raises(ValueError, match="need CUDA"):
        hf_triton.swiglu(q.view(2, 128), 64)


@needs_triton
def test_interpret_needs_the_variable_at_import():
    """In this process triton was not imported with TRITON_INTERPRET=1: asking for the interpreter
    says so instead of failing inside a kernel."""
    import torch

    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("this process runs with TRITON_INTERPRET=1")
    gu = torch.zeros(2, 8)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        hf_triton.swiglu(gu, 4, interpret=True)
