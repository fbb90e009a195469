"""Checks of turngym.agents.hf.kernels.triton: its kernels against their torch references, and the slots
engine with them against torch ops. On CPU they run through Triton's interpreter, which triton
enables only when ``TRITON_INTERPRET=1`` is set before its first import, so
tests/agents/test_hf_triton.py runs ``python -m tests.agents.triton_checks kernels|engine`` in a
subprocess with it set; tests/agents/test_hf_cuda.py calls ``kernels("cuda")`` in-process. Prints
one ``ok ...`` line per check, raises on a mismatch."""

import asyncio
import random
import sys

import torch

from turngym.agents.hf.kernels import triton as T


def _attention_case(rng: random.Random, dtype: torch.dtype, device: str) -> float:
    """A random shape: grouped heads (g 1..8), one query or many a row, slots out of order, queries
    as a strided view of a wider projection, positions at 0 and past the attended columns."""
    d = rng.choice([16, 32, 64])
    kv = rng.choice([1, 2, 3])
    g = rng.choice([1, 2, 3, 4, 8])
    h = kv * g
    n = rng.choice([1, 1, 3, 17])
    rows = rng.randint(1, 4)
    n_slots = rows + rng.randint(0, 3)
    max_cols = rng.randint(8, 150)
    columns = rng.randint(1, max_cols)
    keys = torch.randn(n_slots, kv, max_cols, d).to(device, dtype)
    values = torch.randn(n_slots, kv, max_cols, d).to(device, dtype)
    wide = torch.randn(rows * n, h + 2 * kv, d).to(device, dtype)
    q = wide[:, :h]  # strided, as the pass's rotated q would be if it were a view
    slots = torch.tensor(rng.sample(range(n_slots), rows), device=device)
    choices = [rng.choice([0, rng.randrange(max_cols), max_cols + 5]) for _ in range(rows * n)]
    pos = torch.tensor(choices, device=device)
    out = T.slot_attention(q, keys, values, slots, pos, n, columns, interpret=device == "cpu")
    ref = T.slot_attention_reference(q, keys, values, slots, pos, n, columns)
    return (out.float() - ref.float()).abs().max().item()


def _split_case(rng: random.Random, dtype: torch.dtype, device: str) -> float:
    """One query a row over a long context with few rows: the columns are split (flash-decoding),
    positions inside, at and past a split's edge, an empty split included."""
    d, kv, g = rng.choice([16, 32]), rng.choice([1, 2]), rng.choice([1, 3])
    rows, columns = rng.randint(1, 2), rng.choice([1024, 1100, 2048])
    assert T.decode_splits(rows * kv, columns) > 1
    keys = torch.randn(rows + 1, kv, columns + 1, d).to(device, dtype)
    values = torch.randn(rows + 1, kv, columns + 1, d).to(device, dtype)
    q = torch.randn(rows, kv * g, d).to(device, dtype)
    slots = torch.tensor(rng.sample(range(rows + 1), rows), device=device)
    pos = torch.tensor(
        [rng.choice([3, 255, 256, 700, columns - 1, columns + 7]) for _ in range(rows)], device=device
    )
    out = T.slot_attention(q, keys, values, slots, pos, 1, columns, interpret=device == "cpu")
    ref = T.slot_attention_reference(q, keys, values, slots, pos, 1, columns)
    return (out.float() - ref.float()).abs().max().item()


def _rotary_case(rng: random.Random, dtype: torch.dtype, device: str) -> float:
    d = rng.choice([16, 64])
    kv = rng.choice([1, 2, 3])
    h = kv * rng.choice([1, 3])
    tokens, positions, cells = rng.randint(1, 9), 50, 4 * kv * 40
    qkv = torch.randn(tokens, (h + 2 * kv) * d).to(device, dtype)
    cos, sin = torch.randn(positions, d).to(device, dtype), torch.randn(positions, d).to(device, dtype)
    pos = torch.randint(0, positions, (tokens,)).to(device)
    index = torch.tensor(rng.sample(range(cells), tokens * kv), device=device).view(tokens, kv)
    if rng.random() < 0.5:  # a strided view, as a one-row prefill's reshape gives
        index = index.t().contiguous().t()
    k1 = torch.zeros(cells, d, dtype=dtype, device=device)
    v1, k2, v2 = k1.clone(), k1.clone(), k1.clone()
    q1 = T.rotary_write(qkv, cos, sin, pos, index, k1, v1, h, kv, 0.125, interpret=device == "cpu")
    q2 = T.rotary_write_reference(qkv, cos, sin, pos, index, k2, v2, h, kv, 0.125)
    return max((a.float() - b.float()).abs().max().item() for a, b in ((q1, q2), (k1, k2), (v1, v2)))


# max abs error a dtype allows (attention's inputs are N(0, 1): scores of a few units)
TOLERANCE = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 6e-2}


def _sample_case(rng: random.Random, device: str) -> tuple[int, int]:
    """Random rows of logits (ties at the max included) against ``pick`` (no top-k/top-p): greedy
    rows and logprobs must agree; a sampled row must agree unless its draw lies within 1e-5 of a
    boundary of the CDF (blocked vs sequential sums round differently there). (draws, near ones)."""
    from turngym.agents.hf.sampling import pick

    rows, vocab = rng.randint(1, 6), rng.choice([7, 100, 5000, 49152])
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(rng.randrange(2**31)))
    logits = (logits * rng.choice([0.5, 3.0, 10.0])).to(device)
    logits[0, vocab // 2] = logits[0, vocab // 3] = logits[0].max() + 1  # a tie: the first index wins
    temp = (torch.rand(rows) + 0.2).to(device)
    greedy = (torch.rand(rows) < 0.3).to(device)
    u = torch.rand(rows).to(device)
    tok, lp = T.sample(logits, temp, greedy, u, interpret=device == "cpu")
    zeros, ones = torch.zeros(rows, dtype=torch.long, device=device), torch.ones(rows, device=device)
    ref_tok, ref_lp = pick(logits, temp, greedy, zeros, ones, u, False)
    assert torch.allclose(lp, ref_lp, atol=1e-4), (lp, ref_lp)
    cdf = torch.softmax(logits.double() / temp.double()[:, None], dim=-1).cumsum(dim=-1)
    near = (cdf - u.double()[:, None]).abs().min(dim=-1).values < 1e-5
    must = greedy | ~near
    assert torch.equal(tok[must], ref_tok[must]), (tok, ref_tok, greedy, near)
    assert tok[0].item() == vocab // 3 or not greedy[0]
    return int((~greedy).sum()), int((near & ~greedy).sum())


def kernels(device: str = "cpu", dtypes: tuple = (torch.float32, torch.float16)) -> None:
    rng = random.Random(0)
    for dtype in dtypes:
        tol = TOLERANCE[dtype]
        errs = [_attention_case(rng, dtype, device) for _ in range(30)]
        assert max(errs) < tol, (dtype, errs)
        print(f"ok attention {dtype} max error {max(errs):.2e} over {len(errs)} shapes", flush=True)
        errs = [_split_case(rng, dtype, device) for _ in range(6)]
        assert max(errs) < tol, (dtype, errs)
        print(f"ok split attention {dtype} max error {max(errs):.2e}", flush=True)
        errs = [_rotary_case(rng, dtype, device) for _ in range(20)]
        assert max(errs) < tol * 10, (dtype, errs)
        print(f"ok rotary_write {dtype} max error {max(errs):.2e}", flush=True)
        for inter in (1, 100, 1500):
            gu = torch.randn(rng.randint(1, 5), 2 * inter).to(device, dtype)
            got = T.swiglu(gu, inter, interpret=device == "cpu")
            err = (got.float() - T.swiglu_reference(gu, inter).float()).abs().max()
            assert err <= tol * 10, (dtype, inter, err)
        print(f"ok swiglu {dtype}", flush=True)
    counts = [_sample_case(rng, device) for _ in range(25)]
    print(
        f"ok sample: {sum(c[0] for c in counts)} draws, {sum(c[1] for c in counts)} near a boundary",
        flush=True,
    )


def engine(families: tuple[str, ...]) -> None:
    """The slots engine with the interpreted kernels gives the torch ops' greedy ids and logprobs
    (float32) on Llama (biases, untied head, llama3 rope), Mistral (head_dim 32), Qwen2, Qwen3 (q/k norms), across
    turns that resume parked rows, and the same seeded samples."""
    from tests.agents.test_hf_fast import GREEDY, _model, _same, _turns, prompts
    from turngym.agents import SamplingParams
    from turngym.agents.hf import HFSlotBackend
    from turngym.agents.models import load_tokenizer
    from turngym.agents.tiny import tiny_model_path

    tok = load_tokenizer(tiny_model_path())
    seeded = SamplingParams(max_tokens=8, temperature=1.0, top_k=20, seed=3, stop_token_ids=(-1,))

    async def run(kind: str) -> None:
        model = _model(kind, len(tok))
        kw = dict(max_batch_size=8, max_context=256, max_wait_ms=20)
        tri = HFSlotBackend(model, tok, kernels="interpret", **kw)
        ops = HFSlotBackend(model, tok, kernels="torch", **kw)
        assert tri.runner.fast.kernels == "interpret" and ops.runner.fast.kernels == "torch"
        ps = prompts(tok)
        a = await asyncio.gather(*(_turns(tri, tok, p, f"t{i}", GREEDY) for i, p in enumerate(ps)))
        b = await asyncio.gather(*(_turns(ops, tok, p, f"o{i}", GREEDY) for i, p in enumerate(ps)))
        for x, y in zip(a, b, strict=True):
            _same(x, y)
        assert tri.stats["reused_tokens"] > 0 and max(tri.stats["widths"]) > 1
        for p in ps[:2]:  # one row alone: its prefill's flat cache rows are a strided view
            x, y = await tri.generate(p, GREEDY), await ops.generate(p, GREEDY)
            _same([(x.token_ids, x.logprobs)], [(y.token_ids, y.logprobs)])
        # seeded samples (the kernels' sampler, tested against ``pick`` in ``kernels``): the same
        # seeds reproduce, batched or alone; another seed draws other tokens
        s1 = await asyncio.gather(*(tri.generate(p, seeded) for p in ps))
        s2 = [await tri.generate(p, seeded) for p in ps]
        assert [g.token_ids for g in s1] == [g.token_ids for g in s2]
        other = await asyncio.gather(*(tri.generate(p, seeded.replace(seed=4)) for p in ps))
        assert [g.token_ids for g in other] != [g.token_ids for g in s1]
        assert all(-30 < lp <= 0 for g in s1 for lp in g.logprobs)
        assert tri.runner.fast.kernels == "interpret", (
            tri.runner.fast.kernels_problem
        )  # no fallback to torch ops
        await tri.aclose()
        await ops.aclose()
        if kind == "llama":  # a context past SPLIT_COLUMNS: the decode steps split their columns
            kw["max_context"] = 1024
            tri = HFSlotBackend(model, tok, kernels="interpret", **kw)
            ops = HFSlotBackend(model, tok, kernels="torch", **kw)
            long = (ps[1] * 100)[:700]  # its decode steps attend the 1024-column bucket
            assert T.decode_splits(model.config.num_key_value_heads, 1024) > 1
            x, y = await tri.generate(long, GREEDY), await ops.generate(long, GREEDY)
            _same([(x.token_ids, x.logprobs)], [(y.token_ids, y.logprobs)])
            assert tri.runner.fast.kernels == "interpret", tri.runner.fast.kernels_problem
            await tri.aclose()
            await ops.aclose()
        print(f"ok engine {kind}", flush=True)

    for kind in families:
        asyncio.run(run(kind))


#: the suite's sample of the families (llama: biases, llama3 rope and split decode);
#: ``python -m tests.agents.triton_checks engine all`` (TRITON_INTERPRET=1) runs Qwen3 (q/k norms),
#: Mistral and Qwen2 too (each adds ~40 s on 2 cores)
SAMPLED_FAMILIES = ("llama",)
ALL_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")

if __name__ == "__main__":
    torch.manual_seed(0)
    if sys.argv[1] == "engine":
        engine(ALL_FAMILIES if sys.argv[2:] == ["all"] else SAMPLED_FAMILIES)
    else:
        kernels()
