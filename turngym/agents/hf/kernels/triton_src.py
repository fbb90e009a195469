"""The Triton kernels of ``turngym.agents.hf.kernels.triton``, undecorated: that module compiles them
(``triton.jit``) or runs them through Triton's interpreter (CPU tests). Imports ``triton``; only
``kernels.triton`` imports this module, on first use."""

# ruff: noqa: N803, N806 - Triton's convention: pointers and compile-time constants in capitals

import triton.language as tl


def attention(
    Q,
    K,
    V,
    OUT,
    SLOTS,
    POS,
    stride_qt,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_kc,
    stride_ot,
    PART_M,
    PART_L,
    PART_ACC,
    n,
    columns,
    chunk,
    G: tl.constexpr,
    GP: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D: tl.constexpr,
    IEEE: tl.constexpr,
    SPLITS: tl.constexpr,
):
    # one program: row ``program_id(0)``, key/value head ``program_id(1)``, its G query heads, and
    # BLOCK_Q of the row's n queries (tile rows = query x head); keys and values share strides.
    # SPLITS > 1 (one query a row, a decode step): ``program_id(2)`` is instead a split of the
    # columns, ``chunk`` each, whose unnormalised partial result (max, sum, weighted values) goes to
    # PART_* [tokens, heads, SPLITS(, D)] for ``combine`` (flash-decoding: short rows, long contexts)
    row = tl.program_id(0)
    kvh = tl.program_id(1)
    if SPLITS > 1:
        split = tl.program_id(2)
        qb = 0
    else:
        split = 0
        qb = tl.program_id(2)
    r = tl.arange(0, BLOCK_Q * GP)
    qi = qb * BLOCK_Q + r // GP
    gi = r % GP
    valid = (qi < n) & (gi < G)
    head = kvh * G + gi
    t = row * n + qi
    d = tl.arange(0, D)
    q = tl.load(
        Q + t[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :], mask=valid[:, None], other=0.0
    )
    limit = tl.load(POS + t, mask=valid, other=-1)
    slot = tl.load(SLOTS + row)
    hi = tl.minimum(tl.max(limit, 0) + 1, columns)
    lo = split * chunk
    if SPLITS > 1:
        hi = tl.minimum(hi, lo + chunk)
    kbase = K + slot * stride_ks + kvh * stride_kh
    vbase = V + slot * stride_ks + kvh * stride_kh
    m_i = tl.full([BLOCK_Q * GP], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q * GP], tl.float32)
    acc = tl.zeros([BLOCK_Q * GP, D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        c = start + tl.arange(0, BLOCK_N)
        inside = c < hi
        k = tl.load(kbase + c[None, :] * stride_kc + d[:, None], mask=inside[None, :], other=0.0)
        if IEEE:
            s = tl.dot(q, k, input_precision="ieee")
        else:
            s = tl.dot(q, k)
        s = tl.where((c[None, :] <= limit[:, None]) & inside[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(vbase + c[:, None] * stride_kc + d[None, :], mask=inside[:, None], other=0.0)
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    if SPLITS > 1:
        at = (t * (G * tl.num_programs(1)) + head) * SPLITS + split  # [tokens, heads, SPLITS]
        tl.store(PART_M + at, m_i, mask=valid)
        tl.store(PART_L + at, l_i, mask=valid)
        tl.store(PART_ACC + at[:, None] * D + d[None, :], acc, mask=valid[:, None])
    else:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(
            OUT + t[:, None] * stride_ot + head[:, None] * D + d[None, :],
            out.to(OUT.dtype.element_ty),
            mask=valid[:, None],
        )


def combine(PART_M, PART_L, PART_ACC, OUT, heads, stride_ot, SPLITS: tl.constexpr, D: tl.constexpr):
    # one program a (token, head): the splits' partial softmax sums merged, normalised, stored
    t = tl.program_id(0)
    h = tl.program_id(1)
    base = (t * heads + h) * SPLITS
    s = tl.arange(0, SPLITS)
    d = tl.arange(0, D)
    m = tl.load(PART_M + base + s)
    top = tl.max(m, 0)
    top = tl.where(top == float("-inf"), 0.0, top)
    w = tl.exp(m - top)  # 0 for an empty split (its max is -inf)
    l_sum = tl.sum(tl.load(PART_L + base + s) * w, 0)
    acc = tl.sum(tl.load(PART_ACC + (base + s)[:, None] * D + d[None, :]) * w[:, None], 0)
    out = acc / tl.where(l_sum == 0.0, 1.0, l_sum)
    tl.store(OUT + t * stride_ot + h * D + d, out.to(OUT.dtype.element_ty))


def rotary_write(
    QKV,
    COS,
    SIN,
    POS,
    INDEX,
    QOUT,
    KC,
    VC,
    scale,
    stride_t,
    stride_ix,
    H: tl.constexpr,
    KV: tl.constexpr,
    HP: tl.constexpr,
    KVP: tl.constexpr,
    D: tl.constexpr,
):
    # one program a token: its H query heads rotated and scaled into QOUT [tokens, H, D]; its KV
    # key heads rotated and value heads copied into the caches' flat rows INDEX[t, kv]
    t = tl.program_id(0)
    p = tl.load(POS + t)
    d = tl.arange(0, D)
    rot = (d + D // 2) % D
    cos = tl.load(COS + p * D + d).to(tl.float32)[None, :]
    sin = tl.load(SIN + p * D + d).to(tl.float32)[None, :]
    base = QKV + t * stride_t
    hq = tl.arange(0, HP)
    mq = (hq < H)[:, None]
    x = tl.load(base + hq[:, None] * D + d[None, :], mask=mq, other=0.0).to(tl.float32)
    xr = tl.load(base + hq[:, None] * D + rot[None, :], mask=mq, other=0.0).to(tl.float32)
    q = (x * cos + xr * sin) * scale
    tl.store(QOUT + t * (H * D) + hq[:, None] * D + d[None, :], q.to(QOUT.dtype.element_ty), mask=mq)
    hk = tl.arange(0, KVP)
    mk = hk < KV
    x = tl.load(base + (H + hk)[:, None] * D + d[None, :], mask=mk[:, None], other=0.0).to(tl.float32)
    xr = tl.load(base + (H + hk)[:, None] * D + rot[None, :], mask=mk[:, None], other=0.0).to(tl.float32)
    k = x * cos + xr * sin
    idx = tl.load(INDEX + t * stride_ix + hk, mask=mk, other=0)
    tl.store(KC + idx[:, None] * D + d[None, :], k.to(KC.dtype.element_ty), mask=mk[:, None])
    v = tl.load(base + (H + KV + hk)[:, None] * D + d[None, :], mask=mk[:, None], other=0.0)
    tl.store(VC + idx[:, None] * D + d[None, :], v, mask=mk[:, None])


def swiglu(GU, OUT, inter, stride_t, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = j < inter
    g = tl.load(GU + t * stride_t + j, mask=m, other=0.0).to(tl.float32)
    u = tl.load(GU + t * stride_t + inter + j, mask=m, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(OUT + t * inter + j, y.to(OUT.dtype.element_ty), mask=m)


def sample(LOGITS, TEMP, GREEDY, U, TOK, LP, vocab, stride_r, BLOCK: tl.constexpr):
    # one program a row: the argmax (greedy rows) or the inverse-CDF draw at U over softmax(logits /
    # TEMP), and the token's raw logprob. Pass 1: max, first argmax, logsumexp; pass 2: the tempered
    # total; pass 3: the same block sums again, to the block and index where the running sum first
    # exceeds U * total (passes 2 and 3 add in the same order, so the total and the walk agree)
    row = tl.program_id(0)
    base = LOGITS + row * stride_r
    greedy = tl.load(GREEDY + row) != 0
    inv = 1.0 / tl.where(greedy, 1.0, tl.load(TEMP + row).to(tl.float32))
    offs = tl.arange(0, BLOCK)
    best = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), 0)
    best_i = tl.min(tl.zeros([BLOCK], tl.int64), 0)
    m = best
    s = tl.sum(tl.zeros([BLOCK], tl.float32), 0)
    for start in range(0, vocab, BLOCK):
        idx = start + offs
        x = tl.load(base + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32)
        bm = tl.max(x, 0)
        bi = tl.min(tl.where(x == bm, idx, vocab), 0).to(tl.int64)
        best_i = tl.where(bm > best, bi, best_i)
        best = tl.maximum(best, bm)
        m_new = tl.maximum(m, bm)
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), 0)
        m = m_new
    lse = m + tl.log(s)
    mz = best * inv
    total = tl.sum(tl.zeros([BLOCK], tl.float32), 0)
    for start in range(0, vocab, BLOCK):
        idx = start + offs
        x = tl.load(base + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32)
        total += tl.sum(tl.exp(x * inv - mz), 0)
    target = tl.load(U + row) * total
    run = tl.sum(tl.zeros([BLOCK], tl.float32), 0)
    drawn = tl.min(tl.zeros([BLOCK], tl.int64), 0) + vocab - 1
    found = run > 1.0  # False
    for start in range(0, vocab, BLOCK):
        idx = start + offs
        x = tl.load(base + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32)
        e = tl.exp(x * inv - mz)
        block = tl.sum(e, 0)
        here = (run + block > target) & (found == 0)
        cum = run + tl.cumsum(e, 0)
        last = tl.minimum(start + BLOCK, vocab) - 1
        at = tl.min(tl.where((cum > target) & (idx < vocab), idx, last), 0).to(tl.int64)
        drawn = tl.where(here, at, drawn)
        found = found | here
        run += block
    tok = tl.where(greedy, best_i, drawn)
    tl.store(TOK + row, tok)
    tl.store(LP + row, tl.load(base + tok).to(tl.float32) - lse)
