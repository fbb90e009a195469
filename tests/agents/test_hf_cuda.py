"""HF backend on a CUDA GPU (skipped without one): passes run SDPA without cuDNN's attention kernel
(its per-shape plan building cost 40 ms of host time per new shape on an H100) and restore torch's
setting after; batched greedy decoding and prefix reuse give the ids of unbatched full prefills."""

import asyncio

import pytest

from tests.agents import hf_turns
from turngym.agents import SamplingParams
from turngym.agents.hf import HFBackend

pytestmark = pytest.mark.gpu

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=(-1,))


def prompts(tokenizer):
    texts = ["Evaluate: (3 + 4) * 2", "hello world " * 9, "The city is far " * 3]
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


async def three_turns(backend, tokenizer, prompt, route, sampling=GREEDY):
    """Three generations on one route, each turn's prompt the last one plus its output and an
    observation (so later turns resume the route's parked row): the three Generations."""
    obs = tokenizer.encode(" observation: 17", add_special_tokens=False)
    return await hf_turns.three_turns(backend, prompt, route, obs, sampling)


async def same_turns(a_backend, b_backend, tokenizer, ps, tag: str) -> None:
    """Both backends' three greedy turns on each prompt (routes tagged ``tag``): the same ids, and
    logprobs within 1e-3."""
    a = await asyncio.gather(*(three_turns(a_backend, tokenizer, p, f"a{tag}{i}") for i, p in enumerate(ps)))
    b = await asyncio.gather(*(three_turns(b_backend, tokenizer, p, f"b{tag}{i}") for i, p in enumerate(ps)))
    for x, y in zip(a, b, strict=True):
        for g, h in zip(x, y, strict=True):
            assert g.token_ids == h.token_ids
            assert g.logprobs == pytest.approx(h.logprobs, abs=1e-3)


async def three_turn_ids(backend, tokenizer, prompt, route, sampling=GREEDY):
    return [g.token_ids for g in await three_turns(backend, tokenizer, prompt, route, sampling)]


@pytest.mark.parametrize("cudnn", [False, True])
async def test_passes_choose_attention_kernels_and_restore_the_setting(tiny_dir, tokenizer, cudnn):
    import torch

    before = torch.backends.cuda.cudnn_sdp_enabled()
    backend = HFBackend(tiny_dir, tokenizer, device="cuda", dtype=torch.float32, cudnn_attention=cudnn)
    seen = []
    backend.model.register_forward_pre_hook(lambda *_: seen.append(torch.backends.cuda.cudnn_sdp_enabled()))
    gens = await asyncio.gather(*(backend.generate(p, GREEDY) for p in prompts(tokenizer)))
    await backend.aclose()
    assert all(len(g.token_ids) == GREEDY.max_tokens for g in gens)
    assert seen and set(seen) == {before if cudnn else False}
    assert torch.backends.cuda.cudnn_sdp_enabled() == before


async def test_batched_and_resumed_greedy_equal_alone_on_cuda(tiny_dir, tokenizer):
    import torch

    on = HFBackend(tiny_dir, tokenizer, device="cuda", dtype=torch.float32, max_batch_size=8)
    off = HFBackend(on.model, tokenizer, max_batch_size=8, reuse_prefix=False)
    ps = prompts(tokenizer)
    batched = await asyncio.gather(*(three_turns(on, tokenizer, p, f"r{i}") for i, p in enumerate(ps)))
    alone = [await three_turns(off, tokenizer, p, f"r{i}") for i, p in enumerate(ps)]
    assert on.stats["reused_tokens"] > 0 and max(on.stats["widths"]) > 1
    for a_turns, b_turns in zip(batched, alone, strict=True):
        for a, b in zip(a_turns, b_turns, strict=True):
            assert a.token_ids == b.token_ids
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-3)
    await on.aclose()
    await off.aclose()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
async def test_slot_graphs_give_the_eager_ids_and_seeded_samples(tiny_dir, tokenizer, dtype):
    """The slots engine's CUDA-graph decode steps (captured per width and context bucket, sampling
    inside) give the ids of its eager steps, greedy and seeded, across turns that resume parked
    rows; under fp32 also the continuous engine's greedy ids."""
    import torch

    from turngym.agents.hf import HFSlotBackend
    from turngym.agents.models import load_model

    model = load_model(tiny_dir, device="cuda", dtype=getattr(torch, dtype))
    graphs = HFSlotBackend(model, tokenizer, max_batch_size=8, max_context=512)
    eager = HFSlotBackend(model, tokenizer, max_batch_size=8, max_context=512, cuda_graphs=False)
    seeded = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=5, stop_token_ids=(-1,))

    def turns(backend, prompt, route, sampling):
        return three_turn_ids(backend, tokenizer, prompt, route, sampling)

    for sampling in (GREEDY, seeded):
        ps = prompts(tokenizer)
        a = await asyncio.gather(*(turns(graphs, p, f"g{i}", sampling) for i, p in enumerate(ps)))
        b = await asyncio.gather(*(turns(eager, p, f"e{i}", sampling) for i, p in enumerate(ps)))
        assert a == b
    assert graphs.stats["graph_captures"] > 1 and graphs.stats["graph_replays"] > 0
    assert graphs.stats["graph_fallbacks"] == 0 and graphs.stats["reused_tokens"] > 0
    if dtype == "float32":
        cont = HFBackend(model, tokenizer, max_batch_size=8)
        c = await asyncio.gather(*(turns(cont, p, f"c{i}", GREEDY) for i, p in enumerate(prompts(tokenizer))))
        g = await asyncio.gather(
            *(turns(graphs, p, f"h{i}", GREEDY) for i, p in enumerate(prompts(tokenizer)))
        )
        assert c == g
        await cont.aclose()
    await graphs.aclose()
    await eager.aclose()


async def test_compiled_slot_graphs_give_the_eager_ids(tiny_dir, tokenizer):
    """The slots engine with ``compile`` on (the decode body through torch.compile, then captured as
    a CUDA graph per bucket) gives the eager steps' greedy and seeded ids across turns that resume
    parked rows (fp32), and sees an in-place weight update."""
    import torch

    from turngym.agents.hf import HFSlotBackend
    from turngym.agents.models import load_model

    model = load_model(tiny_dir, device="cuda", dtype=torch.float32)
    fused = HFSlotBackend(model, tokenizer, max_batch_size=8, max_context=512, compile="default")
    eager = HFSlotBackend(model, tokenizer, max_batch_size=8, max_context=512, cuda_graphs=False)
    seeded = SamplingParams(max_tokens=12, temperature=1.0, seed=5, stop_token_ids=(-1,))

    def turns(backend, prompt, route, sampling):
        return three_turn_ids(backend, tokenizer, prompt, route, sampling)

    async def both(tag):
        got = {}
        for name, backend in (("fused", fused), ("eager", eager)):
            for sampling in (GREEDY, seeded):
                ps = prompts(tokenizer)
                got[name, sampling.seed] = await asyncio.gather(
                    *(turns(backend, p, f"{tag}{name}{i}", sampling) for i, p in enumerate(ps))
                )
        return got

    got = await both("a")
    assert got["fused", None] == got["eager", None] and got["fused", 5] == got["eager", 5]
    st = fused.stats
    assert st["compiles"] >= 1 and st["compile_fallbacks"] == 0 and st["graph_fallbacks"] == 0
    assert st["graph_captures"] >= 1 and st["graph_replays"] > 0
    state = {k: v * 3.0 if k.endswith("mlp.down_proj.weight") else v for k, v in model.state_dict().items()}
    fused.update_weights(state)  # the same model object: the eager backend sees it too
    after = await both("b")
    assert after["fused", None] == after["eager", None] and after["fused", None] != got["fused", None]
    await fused.aclose()
    await eager.aclose()


async def test_slot_forks_copy_rows_under_captured_graphs(tiny_dir, tokenizer):
    """``share_prefix`` on the slots engine with CUDA graphs (fp32): forks made after the graphs were
    captured copy their donor's row into the same static cache the graphs read, then decode by replay;
    greedy and seeded forks give the ids of full prefills on an eager backend, and the donor's next
    turn is unchanged."""
    import torch

    from turngym.agents.hf import HFSlotBackend
    from turngym.agents.models import load_model

    model = load_model(tiny_dir, device="cuda", dtype=torch.float32)
    graphs = HFSlotBackend(model, tokenizer, max_batch_size=8, max_context=512, park_s=600.0)
    full = HFSlotBackend(
        model, tokenizer, max_batch_size=8, max_context=512, cuda_graphs=False, reuse_prefix=False
    )
    seeded = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=5, stop_token_ids=(-1,))
    obs = tokenizer.encode(" observation: 17", add_special_tokens=False)
    prompt = prompts(tokenizer)[1]
    first = await graphs.generate(prompt, GREEDY, route="p")  # captures the first graphs
    captured = graphs.stats["graph_captures"]
    context = prompt + first.token_ids + obs
    graphs.share_prefix("p", "c1")
    graphs.share_prefix("p", "c2")
    samplings = [GREEDY, GREEDY, seeded]
    got = await asyncio.gather(
        *(graphs.generate(context, s, route=r) for r, s in zip(("p", "c1", "c2"), samplings, strict=True))
    )
    for g, s in zip(got, samplings, strict=True):
        assert g.token_ids == (await full.generate(context, s)).token_ids
    nxt = context + got[0].token_ids + obs
    assert (await graphs.generate(nxt, GREEDY, route="p")).token_ids == (
        await full.generate(nxt, GREEDY)
    ).token_ids
    # forks arriving with their donor's first request copy its row right after its prefill
    graphs.share_prefix("q", "d1")
    graphs.share_prefix("q", "d2")
    fresh = prompts(tokenizer)[2]
    asks = [("q", GREEDY), ("d1", GREEDY), ("d2", seeded)]
    got = await asyncio.gather(*(graphs.generate(fresh, s, route=r) for r, s in asks))
    for g, (_, s) in zip(got, asks, strict=True):
        assert g.token_ids == (await full.generate(fresh, s)).token_ids
    st = graphs.stats
    assert st["shared_rows"] == 4 and captured >= 1 and st["graph_replays"] > 0 and st["graph_fallbacks"] == 0
    await graphs.aclose()
    await full.aclose()


async def test_fast_forward_equals_transformers_on_cuda(tiny_dir, tokenizer):
    """The slots engine's own forward (``hf.kernels.fast``) under captured graphs gives, in float32, the
    greedy ids and logprobs of transformers' forward across turns that resume parked rows."""
    import torch

    from turngym.agents.hf import HFSlotBackend
    from turngym.agents.models import load_model

    model = load_model(tiny_dir, device="cuda", dtype=torch.float32)
    fast = HFSlotBackend(model, tokenizer, max_batch_size=8, max_context=512)
    plain = HFSlotBackend(model, tokenizer, max_batch_size=8, max_context=512, fast=False)
    assert fast.fast_problem is None
    await same_turns(fast, plain, tokenizer, prompts(tokenizer), "")
    assert fast.stats["graph_replays"] > 0 and fast.stats["graph_fallbacks"] == 0
    await fast.aclose()
    await plain.aclose()


async def test_prefill_graphs_give_the_eager_prefills(tiny_dir, tokenizer):
    """Prefill passes replayed from bucketed CUDA graphs (captured at a bucket's second pass) give
    the ids and logprobs of eager prefills, greedy and seeded, across turns that resume rows."""
    import torch

    from turngym.agents.hf import HFSlotBackend
    from turngym.agents.models import load_model

    model = load_model(tiny_dir, device="cuda", dtype=torch.float32)
    graphs = HFSlotBackend(model, tokenizer, max_batch_size=8, max_context=512)
    eager = HFSlotBackend(model, tokenizer, max_batch_size=8, max_context=512, prefill_graph_tokens=0)
    seeded = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=5, stop_token_ids=(-1,))
    for rep in range(2):  # the second round meets the first round's buckets again
        for sampling in (GREEDY, seeded):
            ps = prompts(tokenizer)
            a = await asyncio.gather(
                *(three_turns(graphs, tokenizer, p, f"g{rep}{i}", sampling) for i, p in enumerate(ps))
            )
            b = await asyncio.gather(
                *(three_turns(eager, tokenizer, p, f"e{rep}{i}", sampling) for i, p in enumerate(ps))
            )
            for x, y in zip(a, b, strict=True):
                for g, h in zip(x, y, strict=True):
                    assert g.token_ids == h.token_ids
                    assert g.logprobs == pytest.approx(h.logprobs, abs=1e-4)
    assert graphs.stats["prefill_graph_captures"] > 0 and graphs.stats["prefill_graph_replays"] > 0
    assert graphs.stats["prefill_graph_fallbacks"] == 0 and eager.stats["prefill_graph_replays"] == 0
    await graphs.aclose()
    await eager.aclose()


async def test_a_prefill_capture_out_of_memory_falls_back_to_eager_prefills(
    tiny_dir, tokenizer, monkeypatch, caplog
):
    """Out of memory while a prefill pass is captured: a warning, ``prefill_graph_fallbacks``, and
    the pass and every later one run eagerly with the eager ids; decode graphs stay on."""
    import torch

    from turngym.agents.hf import HFSlotBackend
    from turngym.agents.hf.runner.slots import SlotRunner
    from turngym.agents.models import load_model

    model = load_model(tiny_dir, device="cuda", dtype=torch.float32)
    graphs = HFSlotBackend(model, tokenizer, max_batch_size=8, max_context=512)
    eager = HFSlotBackend(model, tokenizer, max_batch_size=8, max_context=512, prefill_graph_tokens=0)
    body = SlotRunner.prefill_body

    def oom_in_capture(self, *args):
        if torch.cuda.is_current_stream_capturing():
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (test)")
        return body(self, *args)

    monkeypatch.setattr(SlotRunner, "prefill_body", oom_in_capture)
    for rep in range(2):  # the second round's passes meet the first round's buckets: captures
        await same_turns(graphs, eager, tokenizer, prompts(tokenizer), f"oom{rep}")
    st = graphs.stats
    assert st["prefill_graph_fallbacks"] == 1 and st["prefill_graph_captures"] == 0
    assert st["prefill_graph_replays"] == 0 and graphs.prefill_graph_tokens == 0
    assert st["graph_replays"] > 0 and st["graph_fallbacks"] == 0
    assert "prefilling eagerly from now on" in caplog.text
    await graphs.aclose()
    await eager.aclose()


async def test_precapture_captures_every_bucket_before_serving(tiny_dir, tokenizer):
    """``precapture`` captures every (width, context, block) decode bucket up front, with warm-ups
    that write only the scratch column: serving afterwards captures nothing and gives the eager ids."""
    import torch

    from turngym.agents.hf import HFSlotBackend
    from turngym.agents.models import load_model

    model = load_model(tiny_dir, device="cuda", dtype=torch.float32)
    graphs = HFSlotBackend(model, tokenizer, max_batch_size=4, max_context=256)
    eager = HFSlotBackend(model, tokenizer, max_batch_size=4, max_context=256, cuda_graphs=False)
    captured = graphs.precapture()
    assert captured == 3 * 3 * 2 and graphs.stats["graph_fallbacks"] == 0  # widths 1/2/4, 64/128/256
    ps = prompts(tokenizer)
    a = await asyncio.gather(*(three_turn_ids(graphs, tokenizer, p, f"g{i}") for i, p in enumerate(ps)))
    b = await asyncio.gather(*(three_turn_ids(eager, tokenizer, p, f"e{i}") for i, p in enumerate(ps)))
    assert a == b
    assert graphs.stats["graph_captures"] == captured and graphs.precapture() == 0
    await graphs.aclose()
    await eager.aclose()


def test_triton_kernels_equal_their_references_on_cuda():
    """``hf.kernels.triton``'s attention, rotary/cache write and SwiGLU, compiled, against their torch
    references on random shapes (tests/agents/triton_checks.py) in float32, float16 and bfloat16."""
    import torch

    from tests.agents import triton_checks

    triton_checks.kernels("cuda", (torch.float32, torch.float16, torch.bfloat16))


async def test_triton_kernels_under_graphs_equal_torch_ops(tiny_dir, tokenizer):
    """The slots engine with its Triton kernels (the default on CUDA), graphs and prefill graphs on,
    gives the torch ops' greedy ids and logprobs (float32) across turns that resume parked rows."""
    import torch

    from turngym.agents.hf import HFSlotBackend
    from turngym.agents.models import load_model

    model = load_model(tiny_dir, device="cuda", dtype=torch.float32)
    tri = HFSlotBackend(model, tokenizer, max_batch_size=8, max_context=512)
    ops = HFSlotBackend(model, tokenizer, max_batch_size=8, max_context=512, kernels="torch")
    assert tri.runner.fast.kernels == "triton" and tri.runner.fast.kernels_problem is None
    for rep in range(2):  # the second round replays prefill graphs
        await same_turns(tri, ops, tokenizer, prompts(tokenizer), f"{rep}")
    assert tri.runner.fast.kernels == "triton", tri.runner.fast.kernels_problem  # no fallback to torch ops
    assert tri.stats["graph_replays"] > 0 and tri.stats["prefill_graph_replays"] > 0
    assert tri.stats["graph_fallbacks"] == 0 and tri.stats["prefill_graph_fallbacks"] == 0
    await tri.aclose()
    await ops.aclose()


async def test_long_context_decode_splits_under_graphs(tiny_dir, tokenizer):
    """Two rows over a context past SPLIT_COLUMNS: the decode steps' attention splits its columns
    (``hf.kernels.triton.decode_splits``) inside the captured graphs and gives the torch ops' greedy ids and
    logprobs (float32) across resumed turns."""
    import torch

    from turngym.agents.hf import HFSlotBackend
    from turngym.agents.hf.kernels import triton as hf_triton
    from turngym.agents.models import load_model

    model = load_model(tiny_dir, device="cuda", dtype=torch.float32)
    kv = model.config.num_key_value_heads
    assert hf_triton.decode_splits(2 * kv, 2048) > 1
    tri = HFSlotBackend(model, tokenizer, max_batch_size=2, max_context=2048)
    ops = HFSlotBackend(model, tokenizer, max_batch_size=2, max_context=2048, kernels="torch")
    await same_turns(tri, ops, tokenizer, [(p * 200)[:1100] for p in prompts(tokenizer)[:2]], "")
    assert tri.runner.fast.kernels == "triton", tri.runner.fast.kernels_problem
    assert tri.stats["graph_replays"] > 0 and tri.stats["graph_fallbacks"] == 0
    await tri.aclose()
    await ops.aclose()


async def test_an_engine_on_the_second_card_captures_its_graphs_there(tiny_dir, tokenizer):
    """A rank's model on cuda:1 (torchrun's second rank): the engine's scheduler thread, which starts on
    device 0 like every new thread, must run its Triton kernels and graph captures on cuda:1 — measured
    on 2 H200s before the fix: "Pointer argument cannot be accessed from Triton", every capture failed."""
    import torch

    from turngym.agents.hf import HFSlotBackend
    from turngym.agents.models import load_model

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    model = load_model(tiny_dir, device="cuda:1", dtype=torch.bfloat16)
    graphs = HFSlotBackend(model, tokenizer, max_batch_size=8, max_context=512)
    eager = HFSlotBackend(model, tokenizer, max_batch_size=8, max_context=512, cuda_graphs=False)
    ps = prompts(tokenizer)
    a = await asyncio.gather(*(three_turn_ids(graphs, tokenizer, p, f"g{i}") for i, p in enumerate(ps)))
    b = await asyncio.gather(*(three_turn_ids(eager, tokenizer, p, f"e{i}") for i, p in enumerate(ps)))
    assert a == b
    assert torch.cuda.current_device() == 0  # the caller's thread is left on its own card
    assert graphs.stats["graph_captures"] > 1 and graphs.stats["graph_fallbacks"] == 0
    await graphs.aclose()
    await eager.aclose()
