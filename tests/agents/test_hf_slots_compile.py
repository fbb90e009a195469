"""The slots engine's ``compile`` option on CPU (the compiled decode body runs there without CUDA
graphs): the eager path's greedy ids and seeded samples across turns that resume parked rows, weight
updates seen without a recompile, a failing compile falling back with a counter, and the option's
path from the trainer's config and ``AgentSpec`` to the backend. With CUDA graphs: test_hf_cuda.py."""

import asyncio
import copy
import logging

import pytest
import torch

from turngym.agents import SamplingParams
from turngym.agents.factory import AgentSpec, make_token_backend
from turngym.agents.hf import HFBackend, HFSlotBackend
from turngym.agents.hf.registry import COMPILE_SETTINGS, compile_setting, make_hf_backend

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, stop_token_ids=(-1,))
SEEDED = SamplingParams(max_tokens=6, temperature=1.0, seed=11, stop_token_ids=(-1,))
PROMPTS = [[5, 6, 7], [8, 9, 10, 11], [12, 13]]
OBS = [20, 21]


@pytest.fixture(scope="module")
def model(tiny_dir):
    from turngym.agents.models import load_model

    return load_model(tiny_dir, dtype=torch.float32)


async def turns(backend, sampling, tag):
    """Three turns per prompt, each resuming its route's parked row; every generation."""

    async def one(i, prompt):
        out = []
        for _ in range(3):
            gen = await backend.generate(
                prompt, sampling.replace(seed=sampling.seed and sampling.seed + i), route=f"{tag}{i}"
            )
            out.append(gen)
            prompt = prompt + gen.token_ids + OBS
        return out

    return [g for gens in await asyncio.gather(*(one(i, p) for i, p in enumerate(PROMPTS))) for g in gens]


@pytest.mark.slow  # inductor compiles a C++ kernel set per bucket: tens of seconds on a cold cache
async def test_compiled_steps_give_the_eager_ids_and_see_weight_updates(model, tokenizer):
    own = copy.deepcopy(model)
    # one width and one context bucket (3 rows in 4 slots, < 64 columns): one compile serves all
    fused = HFSlotBackend(own, tokenizer, max_batch_size=4, max_context=64, max_wait_ms=50, compile="default")
    plain = HFSlotBackend(own, tokenizer, max_batch_size=4, max_context=64, max_wait_ms=50)
    for sampling in (GREEDY, SEEDED):  # greedy rows and seeded draws: the same program (unfiltered)
        a, b = await turns(fused, sampling, "f"), await turns(plain, sampling, "p")
        assert [g.token_ids for g in a] == [g.token_ids for g in b]
        for x, y in zip(a, b, strict=True):
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)
    assert fused.stats["compiles"] >= 1 and fused.stats["compile_fallbacks"] == 0
    assert fused.stats["compile_s"] > 0 and fused.stats["reused_tokens"] > 0
    assert fused.stats["eager_decodes"] > 0 and fused.compile == "default"
    again = await turns(fused, SEEDED, "g")  # seeded samples reproduce
    assert [g.token_ids for g in again] == [g.token_ids for g in b]

    # weights updated in place: the compiled body reads the live parameters, no recompile
    compiles = fused.stats["compiles"]
    before = fused.generate_batch(PROMPTS, [GREEDY] * 3)
    state = {k: v * 3.0 if k.endswith("mlp.down_proj.weight") else v for k, v in own.state_dict().items()}
    fused.update_weights(state)
    after = fused.generate_batch(PROMPTS, [GREEDY] * 3)
    ref = HFSlotBackend(own, tokenizer, max_batch_size=4, max_context=64).generate_batch(
        PROMPTS, [GREEDY] * 3
    )
    assert [g.logprobs for g in after] != [g.logprobs for g in before]
    assert [g.token_ids for g in after] == [g.token_ids for g in ref]
    for x, y in zip(after, ref, strict=True):
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)
    assert fused.stats["compiles"] == compiles
    await fused.aclose()
    await plain.aclose()


@pytest.mark.parametrize("where", ["wrap", "first call"])
async def test_a_failing_compile_falls_back_to_the_plain_step(model, tokenizer, monkeypatch, caplog, where):
    """Fault injection: ``torch.compile`` raising when asked (e.g. an unsupported setting) or its
    compiled function raising at the first call (where inductor's real errors surface: no C++
    compiler, an op it cannot lower)."""

    def broken(fn, **kwargs):
        if where == "wrap":
            raise RuntimeError("inductor is broken here")

        def compiled(*args):
            raise RuntimeError("C++ compile failed: no compiler\nlong log")

        return compiled

    monkeypatch.setattr(torch, "compile", broken)
    fused = HFSlotBackend(model, tokenizer, max_batch_size=4, max_context=64, compile=True)
    plain = HFSlotBackend(model, tokenizer, max_batch_size=4, max_context=64)
    with caplog.at_level(logging.WARNING, logger="turngym.agents.hf.runner.graphs"):
        got = await turns(fused, GREEDY, "f")
    assert [g.token_ids for g in got] == [g.token_ids for g in await turns(plain, GREEDY, "p")]
    assert fused.stats["compile_fallbacks"] == 1 and fused.stats["compiles"] == 0
    assert fused.compile is None and fused.stats["eager_decodes"] > 0
    assert "torch.compile of the decode step failed (RuntimeError" in caplog.text
    assert "running it uncompiled" in caplog.text
    await fused.aclose()
    await plain.aclose()


def test_compile_settings_and_their_path_to_the_backend(model, tokenizer, caplog):
    from turngym.trainer.config import load_config

    assert compile_setting(True) == "default" and compile_setting("true") == "default"
    for off in (None, False, "", "off", "none", "False"):
        assert compile_setting(off) is None
    assert set(COMPILE_SETTINGS) == {"default", "max-autotune-no-cudagraphs", "dynamic"}
    assert all(s["mode"] not in ("reduce-overhead", "max-autotune") for s in COMPILE_SETTINGS.values())
    with pytest.raises(ValueError, match="unknown compile setting 'reduce-overhead'; choose from default, "):
        compile_setting("reduce-overhead")  # inductor's own CUDA graphs would fight the backend's
    with pytest.raises(ValueError, match="unknown compile setting"):
        AgentSpec(kind="hf", model="tiny", hf_compile="reduce-overhead")
    with pytest.raises(ValueError, match="unknown compile setting 'fast'"):
        HFSlotBackend(model, tokenizer, compile="fast")
    assert AgentSpec(kind="hf", model="tiny", hf_compile=True).hf_compile == "default"
    spec = load_config(None, ["rollout.backend.hf_compile=max-autotune-no-cudagraphs"]).backend_spec()
    assert spec.hf_compile == "max-autotune-no-cudagraphs"
    assert load_config(None, []).backend_spec().hf_compile is None
    slots_spec = AgentSpec(kind="hf", model="tiny", hf_engine="slots", hf_compile="default", max_context=64)
    assert (
        make_token_backend(slots_spec, model=model, tokenizer=tokenizer).compile == "default"
    )  # the trainer's way

    made = make_hf_backend(model, tokenizer, engine="slots", max_context=64, compile="dynamic")
    assert isinstance(made, HFSlotBackend) and made.compile == "dynamic"
    assert make_hf_backend(model, tokenizer, engine="slots", max_context=64).compile is None
    with caplog.at_level(logging.WARNING, logger="turngym.agents.hf.registry"):
        plain = make_hf_backend(model, tokenizer, engine="continuous", compile="default")
    assert type(plain) is HFBackend
    assert "the HFBackend engine does not compile its steps; compile='default' ignored" in caplog.text
