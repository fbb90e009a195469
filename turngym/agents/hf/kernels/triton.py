"""Triton kernels of the fast forward (``turngym.agents.hf.kernels.fast``) and the slots engine,
each one kernel where the torch ops of the same step take several (why: docs/engines.md):

* ``slot_attention``: each query attends to the columns ``0..pos`` of its row's slot, read in place
  from the slots' key/value buffers (the query heads that share a key/value head are one tile),
  online softmax and the value sum in one pass, fp32 accumulation; a program stops at its queries'
  last column. A decode step with few rows over a long context (``decode_splits``) splits the
  columns among programs and merges their partial sums in a second kernel (``combine``).
* ``rotary_write``: q and k rotated from the per-position cos/sin table (q scaled by the attention
  scale), q written out, k and v written into the slots at their flat rows (the scratch column for
  padded queries).
* ``swiglu``: ``silu(gate) * up`` from the fused gate/up output, in fp32, one rounding.
* ``sample``: ``sampling.pick`` for rows without top-k/top-p, one program a row: greedy argmax, the
  inverse-CDF draw at the row's seeded uniform over the tempered softmax, and the raw logprob.

Each has a torch reference beside it (``*_reference``) that the tests compare against, on CPU
through Triton's interpreter (``interpret=True``) and on CUDA. ``problem(device, head_dim)`` says
why the kernels cannot run for a model (not on CUDA, no ``triton``, a head size they do not tile).
"""

from __future__ import annotations

import functools
import math
from typing import Any


def problem(device: Any, head_dim: int, interpret: bool = False) -> str | None:
    """Why the kernels cannot run for a model on ``device`` with this head size (None: they can):
    the compiled kernels need CUDA on an Ampere or later GPU (``interpret``: the interpreter, CPU
    tensors), an importable ``triton``, and a head size that is a power of two of at least 16 (a
    tile's side)."""
    if not interpret and getattr(device, "type", str(device).split(":")[0]) != "cuda":
        return f"the model is on {device}, not CUDA"
    if head_dim < 16 or head_dim & (head_dim - 1):
        return f"head_dim {head_dim} is not a power of two >= 16"
    if not interpret:
        import torch

        major, minor = torch.cuda.get_device_capability(device)
        if major < 8:  # bf16 tiles in tl.dot need Ampere or later
            return f"compute capability {major}.{minor} (the kernels need 8.0 or later)"
    try:
        import triton  # noqa: F401
    except Exception as e:  # noqa: BLE001 - not installed, or broken beside this torch
        return f"triton cannot be imported ({type(e).__name__}: {e})"
    return None


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@functools.cache
def _kernels(interpret: bool) -> dict[str, Any]:
    """The kernels (``triton_src``), compiled for the GPU (``triton.jit``) or run by Triton's
    interpreter on CPU tensors (tests). Made on first use, so importing this module needs no ``triton``."""
    import triton

    from turngym.agents.hf.kernels import triton_src as k

    if interpret and not triton.knobs.runtime.interpret:
        raise RuntimeError(
            "kernels.triton: interpret=True needs TRITON_INTERPRET=1 in the environment before triton is "
            "first imported (its own library functions are made for the interpreter then)"
        )

    def wrap(fn):
        return triton.jit(
            fn, do_not_specialize=[i for i in ("n", "columns", "chunk", "scale", "vocab") if i in _args(fn)]
        )

    return {
        "attention": wrap(k.attention),
        "rotary_write": wrap(k.rotary_write),
        "swiglu": wrap(k.swiglu),
        "sample": wrap(k.sample),
        "combine": wrap(k.combine),
    }


def _args(fn: Any) -> tuple[str, ...]:
    return fn.__code__.co_varnames[: fn.__code__.co_argcount]


def _rows(x: Any) -> Any:
    """``x`` with a contiguous last dim (a copy only when it is not: e.g. a one-row reshape's view)."""
    return x if x.shape[-1] == 1 or x.stride(-1) == 1 else x.contiguous()


def _get(name: str, t: Any, interpret: bool) -> Any:
    if not interpret and not t.is_cuda:
        raise ValueError(f"kernels.triton.{name}: tensors on {t.device}; the compiled kernels need CUDA")
    return _kernels(interpret)[name]


# ------------------------------------------------------------------ attention
def slot_attention(
    q: Any, keys: Any, values: Any, slots: Any, pos: Any, n: int, columns: int, *, interpret: bool = False
) -> Any:
    """Attention of the queries ``q`` ``[rows * n, heads, d]`` (scaled already; token ``row * n + i``)
    over their rows' slots in ``keys``/``values`` ``[slots, kv_heads, max_columns, d]`` (one layer's
    buffers): row ``r``'s query ``i`` attends to its slot ``slots[r]``'s columns ``0 ..
    pos[r * n + i]`` (and below ``columns``). ``[rows * n, heads * d]`` in ``q``'s dtype."""
    import torch

    kernel = _get("attention", q, interpret)
    tokens, h, d = q.shape
    rows = tokens // n
    kv = keys.shape[1]
    g = h // kv
    if keys.stride() != values.stride() or keys.stride(-1) != 1:
        raise ValueError("slot_attention: keys and values need the same strides and a contiguous last dim")
    q, slots, pos = _rows(q), slots.contiguous(), pos.reshape(-1).contiguous()
    gp = _next_pow2(g)
    block_q = max(1, 16 // gp) if n == 1 else max(1, 64 // gp)
    out = torch.empty((tokens, h * d), dtype=q.dtype, device=q.device)
    splits = decode_splits(rows * kv, columns) if n == 1 else 1
    if splits > 1:  # flash-decoding: partial results per split of the columns, then ``combine``
        part_m = torch.empty((tokens, h, splits), dtype=torch.float32, device=q.device)
        part_l = torch.empty_like(part_m)
        part_acc = torch.empty((tokens, h, splits, d), dtype=torch.float32, device=q.device)
        grid = (rows, kv, splits)
    else:
        part_m = part_l = part_acc = out  # not written
        grid = (rows, kv, math.ceil(n / block_q))
    chunk = _BLOCK_N * math.ceil(columns / splits / _BLOCK_N)
    kernel[grid](
        q,
        keys,
        values,
        out,
        slots,
        pos,
        q.stride(0),
        q.stride(1),
        keys.stride(0),
        keys.stride(1),
        keys.stride(2),
        out.stride(0),
        part_m,
        part_l,
        part_acc,
        n,
        columns,
        chunk,
        G=g,
        GP=gp,
        BLOCK_Q=block_q,
        BLOCK_N=_BLOCK_N,
        D=d,
        # fp32 dots in full precision unless torch allows TF32 for fp32 matmuls (set_float32_matmul_precision)
        IEEE=q.dtype == torch.float32 and torch.get_float32_matmul_precision() == "highest",
        SPLITS=splits,
    )
    if splits > 1:
        _get("combine", q, interpret)[(tokens, h)](
            part_m, part_l, part_acc, out, h, out.stride(0), SPLITS=splits, D=d
        )
    return out


_BLOCK_N = 64  # key columns a step of the attention's loop
SPLIT_PROGRAMS = 256  # a decode step with fewer (rows x kv heads) programs than this splits its columns ...
SPLIT_COLUMNS = 1024  # ... once it attends at least this many columns
SPLIT_MIN = 256  # columns a split covers at least


def decode_splits(programs: int, columns: int) -> int:
    """How many splits of the columns a decode step's attention runs (a power of two; 1: none): few
    rows over a long context leave most of the GPU idle with one program a row and key/value head,
    each walking every column in turn, so the columns are split until there are about
    ``SPLIT_PROGRAMS`` programs, each split at least ``SPLIT_MIN`` columns. The engines benchmark's
    shapes (contexts up to 512) do not split."""
    if programs >= SPLIT_PROGRAMS or columns < SPLIT_COLUMNS:
        return 1
    want = min(math.ceil(SPLIT_PROGRAMS / programs), columns // SPLIT_MIN)
    return max(1, 1 << (want.bit_length() - 1))  # the power of two at or below


def slot_attention_reference(
    q: Any, keys: Any, values: Any, slots: Any, pos: Any, n: int, columns: int
) -> Any:
    """``slot_attention`` in torch ops (float32), for the tests."""
    import torch

    tokens, h, d = q.shape
    rows, kv = tokens // n, keys.shape[1]
    k = keys[slots, :, :columns].float().repeat_interleave(h // kv, dim=1)  # [rows, h, columns, d]
    v = values[slots, :, :columns].float().repeat_interleave(h // kv, dim=1)
    qh = q.float().view(rows, n, h, d).transpose(1, 2)  # [rows, h, n, d]
    scores = qh @ k.transpose(-1, -2)
    allowed = torch.arange(columns, device=q.device)[None, None, :] <= pos.reshape(rows, n)[:, :, None]
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v
    return out.transpose(1, 2).reshape(tokens, h * d).to(q.dtype)


# ------------------------------------------------------------------ rotary and the cache write
def rotary_write(
    qkv: Any,
    cos: Any,
    sin: Any,
    pos: Any,
    index: Any,
    keys: Any,
    values: Any,
    heads: int,
    kv_heads: int,
    scale: float,
    *,
    interpret: bool = False,
) -> Any:
    """From the fused projection ``qkv`` ``[tokens, (heads + 2 kv_heads) * d]``: q and k rotated by
    the position's row of ``cos``/``sin`` ``[positions, d]`` (``sin`` with ``rotate_half``'s signs
    folded in: its first half negated), q times ``scale``; k and v written into ``keys``/``values``
    (one layer's buffers, viewed as ``[-1, d]``) at the flat rows ``index`` ``[tokens, kv_heads]``.
    Returns q ``[tokens, heads, d]``."""
    import torch

    kernel = _get("rotary_write", qkv, interpret)
    tokens = qkv.shape[0]
    d = cos.shape[-1]
    if not (keys.is_contiguous() and values.is_contiguous()):
        raise ValueError("rotary_write: the key and value buffers must be contiguous")
    qkv, index = _rows(qkv), _rows(index)
    q = torch.empty((tokens, heads, d), dtype=qkv.dtype, device=qkv.device)
    kernel[(tokens,)](
        qkv,
        cos,
        sin,
        pos.reshape(-1).contiguous(),
        index,
        q,
        keys,
        values,
        float(scale),
        qkv.stride(0),
        index.stride(0),
        H=heads,
        KV=kv_heads,
        HP=_next_pow2(heads),
        KVP=_next_pow2(kv_heads),
        D=d,
    )
    return q


def rotary_write_reference(
    qkv: Any,
    cos: Any,
    sin: Any,
    pos: Any,
    index: Any,
    keys: Any,
    values: Any,
    heads: int,
    kv_heads: int,
    scale: float,
) -> Any:
    """``rotary_write`` in torch ops (float32 arithmetic), for the tests."""
    import torch

    d = cos.shape[-1]
    x = qkv.float().view(qkv.shape[0], heads + 2 * kv_heads, d)
    c, s = cos[pos.reshape(-1)].float()[:, None], sin[pos.reshape(-1)].float()[:, None]
    qk = x[:, : heads + kv_heads] * c + torch.roll(x[:, : heads + kv_heads], d // 2, dims=-1) * s
    keys.view(-1, d)[index.reshape(-1)] = qk[:, heads:].reshape(-1, d).to(keys.dtype)
    values.view(-1, d)[index.reshape(-1)] = x[:, heads + kv_heads :].reshape(-1, d).to(values.dtype)
    return (qk[:, :heads] * scale).to(qkv.dtype)


# ------------------------------------------------------------------ SwiGLU
def swiglu(gu: Any, inter: int, *, interpret: bool = False) -> Any:
    """``silu(gu[:, :inter]) * gu[:, inter:]`` ``[tokens, inter]``, computed in fp32 and rounded once."""
    import torch

    kernel = _get("swiglu", gu, interpret)
    gu = _rows(gu)
    out = torch.empty((gu.shape[0], inter), dtype=gu.dtype, device=gu.device)
    block = min(1024, _next_pow2(inter))
    kernel[(gu.shape[0], math.ceil(inter / block))](gu, out, inter, gu.stride(0), BLOCK=block)
    return out


def swiglu_reference(gu: Any, inter: int) -> Any:
    import torch.nn.functional as F

    g = gu.float()
    return (F.silu(g[:, :inter]) * g[:, inter:]).to(gu.dtype)


# ------------------------------------------------------------------ sampling
def sample(logits: Any, temp: Any, greedy: Any, u: Any, *, interpret: bool = False) -> tuple[Any, Any]:
    """``sampling.pick`` without top-k/top-p, one kernel a row: the token of each row of ``logits``
    ``[rows, vocab]`` (greedy rows: the first argmax; the others: the inverse CDF of
    ``softmax(logits / temp)`` at ``u``) and its raw logprob (``logits[tok] - logsumexp(logits)``),
    in fp32. The CDF is summed in blocks, so a draw within float rounding of a token boundary may
    pick the neighbour that torch's sequential ``cumsum`` would not; the kernel itself is
    deterministic (graphs and eager passes agree). Returns (int64 tokens, float32 logprobs)."""
    import torch

    kernel = _get("sample", logits, interpret)
    logits = _rows(logits)
    rows, vocab = logits.shape
    tok = torch.empty(rows, dtype=torch.long, device=logits.device)
    lp = torch.empty(rows, dtype=torch.float32, device=logits.device)
    kernel[(rows,)](
        logits,
        temp.contiguous(),
        greedy.contiguous(),
        u.contiguous(),
        tok,
        lp,
        vocab,
        logits.stride(0),
        BLOCK=min(4096, _next_pow2(vocab)),
    )
    return tok, lp
