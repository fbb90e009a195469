"""The fast forward's Triton kernels (``turngym.agents.hf.kernels.triton``): attention over the slots,
rotary with the cache write and SwiGLU equal their torch references on random shapes (grouped
heads, one or many queries a row, slots out of order, strided queries, positions at 0 and past the
attended columns), and the slots engine with them gives the torch ops' greedy ids, logprobs and
seeded samples on Llama across resumed turns (Qwen3, Mistral and Qwen2 too with `python -m
tests.agents.triton_checks engine all`); both on CPU through Triton's
interpreter (float32, float16), in a subprocess since triton reads ``TRITON_INTERPRET`` at import.
Which kernels a forward uses, and the refusals. On CUDA (bf16, captured graphs): test_hf_cuda.py."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from turngym.agents.hf import HFSlotBackend
from turngym.agents.hf.kernels import triton as hf_triton
from turngym.agents.hf.kernels.fast import FastForward

ROOT = Path(__file__).resolve().parents[2]
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")


def _interpret(check: str) -> str:
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "2"}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.agents.triton_checks", check],
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
    # the suite's sample: Llama (SmolLM2's family, with biases); `python -m tests.agents.triton_checks
    # engine all` adds Qwen3 (q/k norms), Mistral and Qwen2
    assert [line for line in out.splitlines() if line.startswith("ok engine")] == ["ok engine llama"]


def test_kernel_choice_and_refusals(tiny_dir, tokenizer):
    backend = HFSlotBackend(tiny_dir, tokenizer, max_batch_size=2, max_context=64)
    assert backend.runner.fast.kernels == "torch"  # CPU: the compiled kernels need CUDA
    assert "not CUDA" in backend.runner.fast.kernels_problem
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


@needs_triton
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_kernels_compile_for_hopper_without_a_gpu(dtype):
    """Every kernel compiles (Triton IR to PTX and a cubin, ptxas included) for sm_90 ahead of time,
    as the GPU machines will JIT them: a kernel that only the interpreter accepts fails here."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from turngym.agents.hf.kernels import triton_src as k

    def compile_(fn, signature, constants):
        src = ASTSource(fn=triton.jit(fn), signature=signature, constexprs=constants)
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32))
        assert compiled.asm.get("cubin"), fn.__name__

    t = f"*{dtype}"
    ints = dict.fromkeys(
        ("stride_qt", "stride_qh", "stride_ks", "stride_kh", "stride_kc", "stride_ot"), "i32"
    )
    attention = {"Q": t, "K": t, "V": t, "OUT": t, "SLOTS": "*i64", "POS": "*i64", **ints}
    attention.update(PART_M="*fp32", PART_L="*fp32", PART_ACC="*fp32", n="i32", columns="i32", chunk="i32")
    attention.update(dict.fromkeys(("G", "GP", "BLOCK_Q", "BLOCK_N", "D", "IEEE", "SPLITS"), "constexpr"))
    for block_q, splits in ((4, 1), (4, 4), (16, 1)):
        consts = dict(G=3, GP=4, BLOCK_Q=block_q, BLOCK_N=64, D=64, IEEE=dtype == "fp32", SPLITS=splits)
        compile_(k.attention, attention, consts)
    rotary = {"QKV": t, "COS": t, "SIN": t, "POS": "*i64", "INDEX": "*i64", "QOUT": t, "KC": t, "VC": t}
    rotary.update(scale="fp32", stride_t="i32", stride_ix="i32")
    rotary.update(dict.fromkeys(("H", "KV", "HP", "KVP", "D"), "constexpr"))
    compile_(k.rotary_write, rotary, dict(H=9, KV=3, HP=16, KVP=4, D=64))
    compile_(
        k.swiglu,
        {"GU": t, "OUT": t, "inter": "i32", "stride_t": "i32", "BLOCK": "constexpr"},
        {"BLOCK": 1024},
    )
    sample = {"LOGITS": "*fp32", "TEMP": "*fp32", "GREEDY": "*i1", "U": "*fp32", "TOK": "*i64", "LP": "*fp32"}
    sample.update(vocab="i32", stride_r="i32", BLOCK="constexpr")
    compile_(k.sample, sample, {"BLOCK": 4096})
    combine = {"PART_M": "*fp32", "PART_L": "*fp32", "PART_ACC": "*fp32", "OUT": t, "heads": "i32"}
    combine.update(stride_ot="i32", SPLITS="constexpr", D="constexpr")
    compile_(k.combine, combine, {"SPLITS": 4, "D": 64})


def test_decode_splits():
    """Few rows over a long context split the columns into a power of two of splits of at least
    SPLIT_MIN columns; wide batches and the engines benchmark's contexts (<= 512) do not split."""
    assert hf_triton.decode_splits(768, 512) == 1  # 256 rows x 3 kv heads
    assert hf_triton.decode_splits(3, 512) == 1  # batch 1, the benchmark's context
    assert hf_triton.decode_splits(72, 4096) == 4  # 24 rows x 3 kv heads: 288 programs
    assert hf_triton.decode_splits(3, 4096) == 16
    assert hf_triton.decode_splits(3, 1100) == 4
    assert hf_triton.decode_splits(300, 4096) == 1
    for programs in range(1, 300, 7):
        for columns in (1024, 1500, 2048, 4096):
            s = hf_triton.decode_splits(programs, columns)
            assert s & (s - 1) == 0 and s * hf_triton.SPLIT_MIN <= columns


def test_a_failing_kernel_falls_back_to_torch_ops(tiny_dir, tokenizer, caplog):
    """A kernel that cannot run (here: the interpreter asked for in a process that did not enable
    it) switches the pass to torch ops for good, with a warning; the logits are the torch ops'."""
    import logging

    import torch

    ops = HFSlotBackend(tiny_dir, tokenizer, max_batch_size=2, max_context=64)
    failing = FastForward(ops.model, 65, kernels="interpret")
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("this process runs with TRITON_INTERPRET=1")
    cache = ops.runner.inputs()
    ids = torch.tensor([[5, 6, 7]])
    pos = torch.arange(3)[None]
    cache.index = ops.kv.row_base[:1][:, :, None] + pos[:, None, :]
    cache.rows, cache.columns = torch.tensor([0]), 3
    mask = (torch.arange(3)[None, :] <= pos[0][:, None])[None, None]
    with caplog.at_level(logging.WARNING, logger="turngym.agents.hf.kernels.fast"):
        got = failing.logits(ids, pos, cache, mask)
    assert failing.kernels == "torch" and "TRITON_INTERPRET" in failing.kernels_problem
    assert "torch ops from now on" in caplog.text
    assert torch.allclose(got, ops.runner.fast.logits(ids, pos, cache, mask), atol=1e-5)
