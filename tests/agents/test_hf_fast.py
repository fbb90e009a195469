"""The slots engine's own forward pass (``turngym.agents.hf.kernels.fast``): on Llama, Mistral and Qwen2
models with random weights, biases and norms (float32, CPU) the engine's greedy ids and logprobs
with it equal those with transformers' forward, batched and across turns that reuse parked rows;
rope scaling is honoured; the concatenated weights follow ``update_weights`` and in-place edits;
models it cannot run (LoRA-wrapped, another architecture) get transformers' forward, and
``fast=True`` on them is refused. On CUDA: test_hf_cuda.py."""

import asyncio

import pytest
import torch

from turngym.agents import SamplingParams
from turngym.agents.hf import HFSlotBackend
from turngym.agents.hf.kernels.fast import problem

GREEDY = SamplingParams(max_tokens=10, temperature=0.0, stop_token_ids=(-1,))


def _randomize(model, seed: int) -> None:
    """Non-trivial biases and norm weights (transformers initialises them to 0 and 1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.copy_(p + 0.3 * torch.randn(p.shape, generator=g))


def _model(kind: str, vocab: int):
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    common = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
    )
    torch.manual_seed(0)
    if kind == "llama":  # every bias, an untied head, llama3 rope scaling
        config = LlamaConfig(
            **common,
            attention_bias=True,
            mlp_bias=True,
            tie_word_embeddings=False,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        )
        model = LlamaForCausalLM(config)
    elif kind == "mistral":  # a head_dim other than hidden / heads
        model = MistralForCausalLM(MistralConfig(**common, head_dim=32, sliding_window=None))
    elif kind == "qwen3":  # q/k RMSNorms per head before rotary, a head_dim other than hidden / heads
        model = Qwen3ForCausalLM(Qwen3Config(**common, head_dim=32, tie_word_embeddings=True))
    else:  # q/k/v biases, tied head
        model = Qwen2ForCausalLM(Qwen2Config(**common, tie_word_embeddings=True))
    _randomize(model, 1)
    return model.eval()


def prompts(tokenizer):
    texts = ["Evaluate: (3 + 4)", "hello world " * 6, "<tool_call>", "The city is far " * 4]
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


async def _turns(backend, tokenizer, prompt, route, sampling=GREEDY):
    """Three turns on one route (the later ones resume its parked row): ids and logprobs."""
    out, ids = [], list(prompt)
    for turn in range(3):
        gen = await backend.generate(ids, sampling, route=route)
        out.append((gen.token_ids, gen.logprobs))
        ids = ids + gen.token_ids + tokenizer.encode(f" next {turn}", add_special_tokens=False)
    return out


def _same(a, b) -> None:
    for (ids_a, lp_a), (ids_b, lp_b) in zip(a, b, strict=True):
        assert ids_a == ids_b
        assert lp_a == pytest.approx(lp_b, abs=2e-4)


@pytest.mark.parametrize(
    ("kind", "attention"),
    [("llama", "matmul"), ("mistral", "matmul"), ("qwen2", "matmul"), ("qwen3", "matmul"), ("llama", "sdpa")],
)
async def test_fast_forward_equals_transformers(kind, attention, tokenizer):
    model = _model(kind, len(tokenizer))
    assert problem(model) is None
    fast = HFSlotBackend(model, tokenizer, max_batch_size=8, max_context=256, max_wait_ms=20)
    fast.runner.fast.decode_attention = attention
    plain = HFSlotBackend(model, tokenizer, max_batch_size=8, max_context=256, max_wait_ms=20, fast=False)
    assert fast.fast_problem is None and plain.fast_problem == "fast=False"
    ps = prompts(tokenizer)
    a = await asyncio.gather(*(_turns(fast, tokenizer, p, f"f{i}") for i, p in enumerate(ps)))
    b = await asyncio.gather(*(_turns(plain, tokenizer, p, f"p{i}") for i, p in enumerate(ps)))
    for x, y in zip(a, b, strict=True):
        _same(x, y)
    assert fast.stats["reused_tokens"] > 0 and max(fast.stats["widths"]) > 1
    # sampled, seeded: the same draws over the same distributions give the same tokens
    seeded = SamplingParams(max_tokens=10, temperature=1.0, top_k=20, seed=3, stop_token_ids=(-1,))
    s1 = await asyncio.gather(*(fast.generate(p, seeded) for p in ps))
    s2 = await asyncio.gather(*(plain.generate(p, seeded) for p in ps))
    assert [g.token_ids for g in s1] == [g.token_ids for g in s2]
    await fast.aclose()
    await plain.aclose()


async def test_rope_scaling_is_the_models_own(tokenizer):
    """Positions past the llama3 scaling's original context: the table comes from the model's
    rotary module, so a long prompt still matches transformers' logits."""
    model = _model("llama", len(tokenizer))
    long = (prompts(tokenizer)[3] * 12)[:300]
    fast = HFSlotBackend(model, tokenizer, max_batch_size=2, max_context=512)
    plain = HFSlotBackend(model, tokenizer, max_batch_size=2, max_context=512, fast=False)
    a = await fast.generate(long, GREEDY)
    b = await plain.generate(long, GREEDY)
    assert a.token_ids == b.token_ids
    assert a.logprobs == pytest.approx(b.logprobs, abs=2e-4)
    await fast.aclose()
    await plain.aclose()


async def test_concatenated_weights_follow_weight_changes(tokenizer):
    model = _model("qwen2", len(tokenizer))
    fast = HFSlotBackend(model, tokenizer, max_batch_size=4, max_context=256)
    plain = HFSlotBackend(model, tokenizer, max_batch_size=4, max_context=256, fast=False)
    p = prompts(tokenizer)[1]
    before = (await fast.generate(p, GREEDY)).logprobs
    # through update_weights (load_state_dict copies in place)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for k in state:
        if "q_proj" in k or "up_proj" in k:
            state[k] = state[k] * -1.5
    fast.update_weights(state)
    a, b = await fast.generate(p, GREEDY), await plain.generate(p, GREEDY)
    assert a.token_ids == b.token_ids and a.logprobs == pytest.approx(b.logprobs, abs=2e-4)
    assert a.logprobs != pytest.approx(before, abs=1e-3)
    # an in-place edit with no call at all (an optimizer step on the shared module)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.v_proj.weight.mul_(2.0)
            layer.mlp.gate_proj.weight.add_(0.05)
    a, b = await fast.generate(p, GREEDY), await plain.generate(p, GREEDY)
    assert a.token_ids == b.token_ids and a.logprobs == pytest.approx(b.logprobs, abs=2e-4)
    await fast.aclose()
    await plain.aclose()


def test_qwen3_fast_logits_equal_transformers_forward(tokenizer):
    """Qwen3's q/k norms (non-trivial weights) in the fast forward: its logits over a prefill and a
    decode step equal transformers' own forward of the same random-init model, in float32."""
    from turngym.agents.hf.kv.slots import SlotKV

    model = _model("qwen3", len(tokenizer))
    assert problem(model) is None
    assert any("q_norm" in n for n, _ in model.named_parameters())
    ids = torch.tensor([prompts(tokenizer)[1]])
    n = ids.shape[1]
    with torch.no_grad():
        want = model(input_ids=ids).logits[0, -1].float()
        want_next = model(input_ids=torch.cat([ids, ids[:, :1]], dim=1)).logits[0, -1].float()
    b = HFSlotBackend(model, tokenizer, max_batch_size=2, max_context=128)
    kv: SlotKV = b.kv
    cache = b.runner.inputs()
    with torch.inference_mode():
        cols = torch.arange(n)[None]
        got = b.runner.prefill_logits(ids, cols, torch.tensor([0]), n)[0]
        cache.index = kv.row_base[:1][:, :, None] + torch.tensor([[n]])[:, :, None]
        cache.rows, cache.width, cache.columns = None, 1, n + 1
        mask = (kv.columns[None, : n + 1] <= n)[:, None, None, :]
        got_next = b.runner.fast.logits(ids[:, :1], torch.tensor([[n]]), cache, mask)[0]
    assert torch.allclose(got, want, atol=1e-4) and torch.allclose(got_next, want_next, atol=1e-4)


def test_models_it_cannot_run_get_transformers_forward(tiny_dir, tokenizer):
    from peft import LoraConfig, get_peft_model
    from transformers import GPT2Config, GPT2LMHeadModel

    from turngym.agents.models import load_model

    lora = get_peft_model(
        load_model(tiny_dir), LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    )
    why = problem(lora.base_model.model)
    assert why is not None and "LoRA" in why
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2))
    assert "model_type 'gpt2'" in problem(gpt2)
    qwen = _model("qwen2", len(tokenizer))
    qwen.config.hidden_act = "gelu"
    assert "hidden_act" in problem(qwen)
    qwen.config.hidden_act = "silu"
    with pytest.raises(ValueError, match="fast=True"):
        HFSlotBackend(lora.base_model.model, tokenizer, max_batch_size=2, max_context=64, fast=True)
    served = HFSlotBackend(lora.base_model.model, tokenizer, max_batch_size=2, max_context=64)
    assert served.fast_problem == why
    gen = served.generate_batch([prompts(tokenizer)[0]], [GREEDY])[0]
    assert len(gen.token_ids) == GREEDY.max_tokens
