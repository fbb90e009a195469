"""Weight sync into a real vLLM server (CPU): LoRA adapters hot-loaded after updates."""

import asyncio

import pytest
import torch

from turngym.trainer.weight_sync import InProcessSync, VLLMLoRASync, WeightSyncError

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def test_in_process_sync_is_a_version_counter():
    sync = InProcessSync()
    assert sync(object(), 3) is None and sync.version == 3


def test_lora_sync_refuses_a_full_model():
    from turngym.agents.models import load_model

    with pytest.raises(WeightSyncError, match="peft"):
        VLLMLoRASync(["http://127.0.0.1:9"], "/tmp/x")(load_model("tiny", device="cpu"), 1)


def test_lora_adapters_hot_loaded_into_vllm_serve_the_trained_weights(tmp_path):
    from peft import LoraConfig, get_peft_model

    from turngym.agents.backend import SamplingParams
    from turngym.agents.models import load_model, load_tokenizer
    from turngym.agents.tiny import tiny_model_path
    from turngym.agents.vllm import VLLMBackend, VLLMServer
    from turngym.trainer.batching import token_logprobs

    tok = load_tokenizer("tiny")
    model = get_peft_model(
        load_model("tiny", device="cpu"), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear")
    )
    torch.manual_seed(0)
    with torch.no_grad():  # an "update": non-zero B matrices change the policy
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    prompt = tok.encode("<|im_start|>user\nEvaluate: (3 + 4)<|im_end|>\n<|im_start|>assistant\n")
    with VLLMServer(
        tiny_model_path(), max_model_len=512, dtype="float32", enable_lora=True, max_lora_rank=8
    ) as server:
        sync = VLLMLoRASync([server.url], tmp_path / "adapters", keep=2)
        names = [sync(model, step) for step in (1, 2, 3)]
        assert names == ["policy-1", "policy-2", "policy-3"]

        async def check():
            backend = VLLMBackend(server.url)
            try:
                served = await backend.models()
                gen = await backend.generate(
                    prompt, SamplingParams(max_tokens=8, temperature=0), adapter="policy-3"
                )
                base = await backend.generate(prompt, SamplingParams(max_tokens=8, temperature=0))
                return served, gen, base
            finally:
                await backend.aclose()

        served, gen, base = asyncio.run(check())
    assert "policy-3" in served and "policy-2" in served and "policy-1" not in served  # keep=2
    ids = torch.tensor([prompt + gen.token_ids])
    with torch.no_grad():
        logp, _ = token_logprobs(model, ids, torch.ones_like(ids))
    hf = logp[0, len(prompt) :].tolist()
    assert gen.logprobs == pytest.approx(hf, abs=2e-3)  # vLLM serves exactly the trained adapter
    assert gen.token_ids != base.token_ids or gen.logprobs != pytest.approx(base.logprobs, abs=1e-3)
